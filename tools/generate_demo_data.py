"""Generate the synthetic demo datasets (``mmwf.datasets.synthetic``): COCO instance format under OUT/coco, ADE20K
layout under OUT/ade, and the stand-in softmax DeiT-T checkpoint under OUT/checkpoints.

    python tools/generate_demo_data.py [--out data/demo] [--size 128] [--train 160] [--val 40] [--seed 0]
"""
import argparse
import os.path as osp

from mmwf.datasets import generate
from mmwf.demo import write_softmax_stand_in


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='data/demo')
    parser.add_argument('--size', type=int, default=128)
    parser.add_argument('--train', type=int, default=160)
    parser.add_argument('--val', type=int, default=40)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    generate(args.out, args.size, args.train, args.val, args.seed)
    write_softmax_stand_in(osp.join(args.out, 'checkpoints', 'deit_t_softmax.pth'), args.seed)
    print(f'demo data written to {args.out}/coco, {args.out}/ade, {args.out}/cls and {args.out}/checkpoints')


if __name__ == '__main__':
    main()
