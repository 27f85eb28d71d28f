"""Dynamic strength r = ||dW||_F / ||W0||_F of every dynamic layer of a WeightFormer over a set of images
(the paper's Appendix A.1), as a markdown table and a PNG.

    python tools/analysis/dynamic_strength.py weightformer_t --checkpoint checkpoints/weightformer_t.pth --size 224
    python tools/analysis/dynamic_strength.py configs/cascade_wf_t_coco.py --checkpoint work_dirs/x/iter_1000.pth

BACKBONE is a WeightFormer name (weightformer_t, weightformer_s, ...) or an mmdet / mmseg config (its backbone);
a detector / segmentor checkpoint's ``backbone.`` weights are used. Without --images it uses the demo images
(python tools/generate_demo_data.py writes them).
"""
from __future__ import annotations

import argparse
import statistics

from analysis_args import add_input_args

from mmwf.analysis import build_backbone, dynamic_strength, load_images, save_strength_png, strength_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_input_args(parser, num_images=32, size=224, out='dynamic_strength.png')
    parser.add_argument('--batch-size', type=int, default=4)
    args = parser.parse_args()

    images = load_images(args.images, args.size, args.num_images).to(args.device)
    backbone = build_backbone(args.backbone, args.checkpoint).to(args.device)
    ratios = dynamic_strength(backbone, images, args.batch_size, progress=True)
    print(strength_table(ratios))
    every = [r for rs in ratios.values() for r in rs]
    print(f'all {len(ratios)} dynamic layers, {len(images)} images: mean r {statistics.fmean(every):.4f}')
    save_strength_png(ratios, args.out)
    print(f'saved {args.out}')


if __name__ == '__main__':
    main()
