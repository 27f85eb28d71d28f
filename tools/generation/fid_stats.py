"""Reference statistics for FID: mean and covariance of the FID Inception's pool3 features of real images (a folder,
searched recursively, each image through ADM's centre crop at --size) or of an ADM-format sample batch (``.npz``
with ``arr_0``, uint8 N x H x W x 3), written as ``.npz`` with ``mu`` and ``sigma`` (ADM's keys).

    python tools/generation/fid_stats.py data/imagenet/train data/fid_stats/imagenet256_train.npz \
        --inception checkpoints/pt_inception-2015-12-05-6726825d.pth --size 256 --device cuda
    torchrun --nproc_per_node 8 tools/generation/fid_stats.py ... --launcher pytorch   # every 8th image each

Several processes add up the feature sums and outer products of their images; the statistics are those of one
process.
"""
from __future__ import annotations

import argparse
import glob
import os.path as osp

import numpy as np
import torch
import torch.distributed as dist

from mmwf.datasets import center_crop_arr
from mmwf.datasets.generation_data import IMAGE_EXTENSIONS
from mmwf.engine.world import LAUNCHERS
from mmwf.evaluation import FIDInception
from mmwf.evaluation.fid import add_sums, moment_statistics, moment_sums, summed_over_processes
from mmwf.utils import init_tool_distributed
from mmwf.utils.arrays import check_image_array, load_arrays, read_image
from mmwf.utils.checkpoint import atomic_write, output_problem


def image_source(source: str, limit: int | None) -> np.ndarray | list[str]:
    """The images of ``source``, checked before any work: an ADM ``.npz``'s ``arr_0`` (uint8 N x H x W x 3), or the
    image files of a folder (searched recursively); at most ``limit``."""
    if source.endswith('.npz'):
        arr = load_arrays(source, ('arr_0',), fix="A sample batch holds arr_0 (N, H, W, 3) uint8, as ADM's and "
                          'tools/generation/sample.py write it.')['arr_0']
        check_image_array(arr, f'arr_0 of {source!r}')
        return arr[:limit]
    files = sorted(f for f in glob.glob(osp.join(source, '**', '*'), recursive=True)
                   if f.lower().endswith(IMAGE_EXTENSIONS))[:limit]
    if not files:
        raise SystemExit(f'error: no images ({", ".join(IMAGE_EXTENSIONS)}) under {source!r}')
    return files


def image_batches(images: np.ndarray | list[str], size: int, batch: int, rank: int = 0, world_size: int = 1):
    """uint8 (B, 3, H, W) batches of :func:`image_source`'s images (files through ADM's centre crop at ``size``): of
    every ``world_size``-th image from ``rank``."""
    images = images[rank::world_size]
    for i in range(0, len(images), batch):
        if isinstance(images, np.ndarray):
            arrays = np.ascontiguousarray(images[i:i + batch])
        else:
            arrays = np.stack([center_crop_arr(read_image(f), size) for f in images[i:i + batch]])
        yield torch.from_numpy(arrays).permute(0, 3, 1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('source', help='image folder or ADM-format .npz')
    parser.add_argument('out', help='.npz to write (mu, sigma)')
    parser.add_argument('--inception', required=True, help='local pt_inception-2015-12-05-6726825d.pth')
    parser.add_argument('--size', type=int, default=256, help='centre-crop size of folder images')
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--limit', type=int, help='at most this many images')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args()
    problem = output_problem(args.out)
    if problem:
        raise SystemExit(f'error: out: {problem}')
    source = image_source(args.source, args.limit)
    rank, world_size, args.device = init_tool_distributed(args.launcher, args.device)
    inception = FIDInception(args.inception).to(args.device)
    sums = {}
    for images in image_batches(source, args.size, args.batch_size, rank, world_size):
        with torch.no_grad():
            sums = add_sums(sums, moment_sums(inception(images.to(args.device))[0]))
        print(f'rank {rank}: {int(sums["count"])} images', flush=True)
    sums = summed_over_processes(sums)
    if rank == 0:
        mu, sigma = moment_statistics(sums)
        atomic_write(args.out, lambda f: np.savez(f, mu=mu, sigma=sigma))
        print(f'statistics of {int(sums["count"])} images written to {args.out}')
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
