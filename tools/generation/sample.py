"""Sample a generation config's model (the EMA weights that its checkpoints hold) and write the samples as PNGs and
as one ADM-format ``.npz`` (``arr_0``: uint8 N x H x W x 3, and ``labels``) for ADM's evaluator
(openai/guided-diffusion, evaluations/evaluator.py). Labels as the config's test set draws them.

    python tools/generation/sample.py configs/generation/wf_dit_s_2_in256.py work_dirs/wf_dit_s_2/iter_400000.pth \
        --num-samples 50000 --out work_dirs/wf_dit_s_2/samples --device cuda
"""
from __future__ import annotations

import argparse
import os
import os.path as osp

import numpy as np
import torch
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope

from mmwf.registry import DATASETS, MODELS
from mmwf.utils.checkpoint import atomic_write, load_state_dict_file, load_strict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', help='an mmwf checkpoint of the config (tools/model_converters/dit_to_mmwf.py '
                        'converts DiT / WeightFormer-release .pt files)')
    parser.add_argument('--out', required=True, help='folder for the PNGs and samples_N.npz')
    parser.add_argument('--num-samples', type=int, default=50000)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--cfg-scale', type=float, help='classifier-free guidance (default: the config\'s)')
    parser.add_argument('--no-png', action='store_true', help='write the .npz only')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={})
    args = parser.parse_args()

    cfg = Config.fromfile(args.config)
    cfg.merge_from_dict(args.cfg_options)
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    if args.cfg_scale is not None:
        cfg.model.cfg_scale = args.cfg_scale
    model = MODELS.build(cfg.model)
    load_strict(model, load_state_dict_file(args.checkpoint), args.checkpoint)
    model.to(args.device).eval()
    labels = DATASETS.build(dict(cfg.test_dataloader.dataset, num_samples=args.num_samples)).labels
    os.makedirs(args.out, exist_ok=True)
    images = []
    for i in range(0, len(labels), args.batch_size):
        batch = torch.as_tensor(labels[i:i + args.batch_size], device=args.device)
        for j, sample in enumerate(model.predict(batch)):
            arr = sample['fake_img'].permute(1, 2, 0).cpu().numpy()
            images.append(arr)
            if not args.no_png:
                from PIL import Image
                Image.fromarray(arr).save(osp.join(args.out, f'{i + j:06d}.png'))
        print(f'{len(images)} / {len(labels)} samples', flush=True)
    path = osp.join(args.out, f'samples_{len(images)}.npz')
    atomic_write(path, lambda f: np.savez(f, arr_0=np.stack(images), labels=np.asarray(labels)))
    print(f'wrote {path}' + ('' if args.no_png else f' and {len(images)} PNGs in {args.out}'))


if __name__ == '__main__':
    main()
