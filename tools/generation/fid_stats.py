"""Reference statistics for FID: mean and covariance of the FID Inception's pool3 features of real images (a folder,
searched recursively, each image through ADM's centre crop at --size) or of an ADM-format sample batch (``.npz``
with ``arr_0``, uint8 N x H x W x 3), written as ``.npz`` with ``mu`` and ``sigma`` (ADM's keys).

    python tools/generation/fid_stats.py data/imagenet/train data/fid_stats/imagenet256_train.npz \
        --inception checkpoints/pt_inception-2015-12-05-6726825d.pth --size 256 --device cuda
"""
from __future__ import annotations

import argparse
import glob
import os.path as osp

import numpy as np
import torch

from mmwf.datasets import center_crop_arr
from mmwf.datasets.generation import IMAGE_EXTENSIONS
from mmwf.evaluation import FIDInception, feature_statistics
from mmwf.utils.arrays import load_arrays
from mmwf.utils.checkpoint import atomic_write


def image_batches(source: str, size: int, batch: int, limit: int | None):
    """uint8 (B, 3, H, W) batches of a folder or of an ADM ``.npz``."""
    if source.endswith('.npz'):
        arr = load_arrays(source, ('arr_0',), fix="A sample batch holds arr_0 (N, H, W, 3) uint8, as ADM's and "
                          'tools/generation/sample.py write it.')['arr_0'][:limit]
        for i in range(0, len(arr), batch):
            yield torch.from_numpy(arr[i:i + batch]).permute(0, 3, 1, 2)
        return
    from PIL import Image
    files = sorted(f for f in glob.glob(osp.join(source, '**', '*'), recursive=True)
                   if f.lower().endswith(IMAGE_EXTENSIONS))[:limit]
    if not files:
        raise SystemExit(f'no images under {source!r}')
    for i in range(0, len(files), batch):
        arrays = []
        for f in files[i:i + batch]:
            with Image.open(f) as image:
                arrays.append(center_crop_arr(image, size))
        yield torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('source', help='image folder or ADM-format .npz')
    parser.add_argument('out', help='.npz to write (mu, sigma)')
    parser.add_argument('--inception', required=True, help='local pt_inception-2015-12-05-6726825d.pth')
    parser.add_argument('--size', type=int, default=256, help='centre-crop size of folder images')
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--limit', type=int, help='at most this many images')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args()
    inception = FIDInception(args.inception).to(args.device)
    features = []
    for images in image_batches(args.source, args.size, args.batch_size, args.limit):
        features.append(inception(images.to(args.device))[0].cpu().numpy())
        print(f'{sum(map(len, features))} images', flush=True)
    mu, sigma = feature_statistics(np.concatenate(features))
    atomic_write(args.out, lambda f: np.savez(f, mu=mu, sigma=sigma))
    print(f'statistics of {sum(map(len, features))} images written to {args.out}')


if __name__ == '__main__':
    main()
