"""Turn a trusted training checkpoint into a weights-only file that mmwf (and torch.load) can open safely.

The WeightFormer release's training checkpoints (``.pth`` with ``model``, ``optimizer``, ``lr_scheduler``,
``config`` as a pickled yacs ``CfgNode``, ...) cannot be opened weights-only. This tool unpickles such a
file *only* when ``--trust-source`` is given, keeps the model tensors and writes
``{'state_dict': ..., 'meta': {...}}``, which loads with ``weights_only=True``.

    python tools/model_converters/clean_checkpoint.py ckpt_epoch_299.pth weightformer_t.pth --trust-source
"""
from __future__ import annotations

import argparse
import sys

import torch

from mmwf.utils.checkpoint import (
    CheckpointError,
    UnsafeCheckpointError,
    atomic_save,
    load_weights_only,
    unwrap_state_dict,
)


def convert(src: str, dst: str, trust_source: bool) -> int:
    try:
        ckpt = load_weights_only(src)
    except UnsafeCheckpointError as err:
        if not trust_source:
            raise SystemExit(f'error: {err}\nUnpickling it can run arbitrary code: pass --trust-source only if '
                             'you trust where the file came from.') from None
        try:
            ckpt = torch.load(src, map_location='cpu', weights_only=False)
        except ModuleNotFoundError as missing:
            raise SystemExit(f'error: unpickling {src} needs the module {missing.name!r} '
                             f'(e.g. `pip install {missing.name}`)') from None
    except (FileNotFoundError, CheckpointError) as err:
        raise SystemExit(f'error: {err}') from None
    try:
        tensors = unwrap_state_dict(ckpt, src)
    except CheckpointError as err:
        raise SystemExit(f'error: {err}') from None
    atomic_save({'state_dict': tensors, 'meta': {'converted_from': src}}, dst)
    torch.load(dst, weights_only=True)  # the result must open safely
    print(f'wrote {len(tensors)} tensors to {dst}')
    return len(tensors)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='checkpoint to clean (.pth)')
    parser.add_argument('dst', help='weights-only output file')
    parser.add_argument('--trust-source', action='store_true',
                        help='allow full unpickling of SRC (runs code stored in the file)')
    args = parser.parse_args(argv)
    convert(args.src, args.dst, args.trust_source)


if __name__ == '__main__':
    main(sys.argv[1:])
