"""Command-line options shared by the analysis tools erf.py and dynamic_strength.py."""
import argparse

import torch

from mmwf.analysis import DEMO_IMAGES


def add_input_args(parser: argparse.ArgumentParser, num_images: int, size: int, out: str) -> None:
    """Backbone, weights, images, output, device."""
    parser.add_argument('backbone', help='a classifier name (weightformer_t, weightformer_t_static, deit_s_relu, ...) '
                        'or an mmdet / mmseg config')
    parser.add_argument('--checkpoint', help='weights (backbone, classifier or detector / segmentor checkpoint)')
    parser.add_argument('--images', default=DEMO_IMAGES, help='folder of images (default: the demo images, '
                        'python tools/generate_demo_data.py)')
    parser.add_argument('--num-images', type=int, default=num_images)
    parser.add_argument('--size', type=int, default=size, help='square input size')
    parser.add_argument('--out', default=out, help='PNG to write')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
