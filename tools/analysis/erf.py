"""Effective receptive field of a backbone before and after loading a checkpoint, as a PNG (the WeightFormer
paper's Figure 3): the gradient of the centre output with respect to the input, averaged over images.

    python tools/analysis/erf.py weightformer_t --checkpoint checkpoints/weightformer_t.pth --size 1024 --out erf.png
    python tools/analysis/erf.py configs/upernet_deit_t_ade20k.py --images data/ade/.../validation --num-images 50

BACKBONE is a classifier name (weightformer_t, weightformer_t_static, deit_t_softmax, ...) or an mmdet / mmseg
config (its backbone).
Without --images it uses the demo images (python tools/generate_demo_data.py writes them). Prints the
high-contribution area ratios (RepLKNet's: the centred square holding t of the log-scaled contribution, as a
fraction of the image).
"""
from __future__ import annotations

import argparse
import os.path as osp

import torch
from analysis_args import add_input_args

from mmwf.analysis import area_ratio, build_backbone, effective_receptive_field, load_images, save_erf_png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_input_args(parser, num_images=16, size=512, out='erf.png')
    parser.add_argument('--out-index', type=int, default=-1, help='which backbone output map')
    args = parser.parse_args()

    images = load_images(args.images, args.size, args.num_images).to(args.device)
    states = {'random init': None, **({f'{osp.basename(args.checkpoint)}': args.checkpoint} if args.checkpoint else {})}
    maps = {}
    print('| weights | area ratio t=0.2 | t=0.3 | t=0.5 | t=0.99 |\n|---|---|---|---|---|')
    for title, checkpoint in states.items():
        torch.manual_seed(0)
        backbone = build_backbone(args.backbone, checkpoint).to(args.device)
        maps[title] = effective_receptive_field(backbone, images, args.out_index, progress=True)
        ratios = ' | '.join(f'{area_ratio(maps[title], t):.3f}' for t in (0.2, 0.3, 0.5, 0.99))
        print(f'| {title} | {ratios} |', flush=True)
    save_erf_png(maps, args.out)
    print(f'saved {args.out}')


if __name__ == '__main__':
    main()
