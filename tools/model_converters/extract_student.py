"""Write the student of an ``AttentionDistiller`` checkpoint as a checkpoint of its own: the whole student model
(its detector / segmentor / classifier keys, for ``tools/test.py STUDENT_CONFIG OUT`` or ``load_from``) or, with
``--backbone``, its backbone (for ``init_cfg=dict(type='Pretrained', checkpoint=OUT)``). The teacher is left out.

    python tools/model_converters/extract_student.py work_dirs/distill/iter_90000.pth student.pth
    python tools/model_converters/extract_student.py work_dirs/distill/iter_90000.pth student_backbone.pth --backbone
"""
from __future__ import annotations

import argparse

from mmwf.models.distillers import student_checkpoint
from mmwf.utils.checkpoint import CheckpointError, atomic_save, load_weights_only


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='checkpoint of a run whose model is an AttentionDistiller')
    parser.add_argument('dst', help='output file (.pth, weights-only)')
    parser.add_argument('--backbone', action='store_true', help="only the student's backbone")
    args = parser.parse_args(argv)
    try:
        out = student_checkpoint(load_weights_only(args.src), args.src, args.backbone)
    except (FileNotFoundError, CheckpointError) as err:
        raise SystemExit(f'error: {err}') from None
    atomic_save(out, args.dst)
    what = "the student's backbone" if args.backbone else 'the student model'
    print(f'wrote {len(out["state_dict"])} tensors of {what} to {args.dst}')


if __name__ == '__main__':
    main()
