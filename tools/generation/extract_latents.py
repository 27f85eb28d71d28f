"""Encode an ImageNet-style class folder once into the latent cache that LatentCacheDataset reads (fast-DiT style):
each image through ADM's centre crop, encoded by the VAE (a latent-distribution sample x 0.18215) together with its
horizontal flip. Writes OUT/latents.npy (N, 2, 4, size/8, size/8) float16, OUT/labels.npy and OUT/classes.txt.

Image i's two latent samples are drawn from generators seeded with --seed and i alone, so the cache is the same for
any number of processes. Several processes (``torchrun ... --launcher pytorch``; OUT on a file system they all see)
encode every W-th image each into one cache.

    python tools/generation/extract_latents.py data/imagenet/train data/imagenet256_latents \
        --vae checkpoints/sd-vae-ft-ema --size 256 --device cuda
    torchrun --nproc_per_node 8 tools/generation/extract_latents.py ... --launcher pytorch
"""
from __future__ import annotations

import argparse
import os
import os.path as osp

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from mmwf.datasets import ClassFolderImages
from mmwf.engine.world import LAUNCHERS
from mmwf.models.diffusion import FrozenVAE, index_generators, load_vae
from mmwf.utils import init_tool_distributed
from mmwf.utils.checkpoint import atomic_write


def generators(seed: int, indices: torch.Tensor, device: str) -> list[torch.Generator]:
    """Per image i, one generator for the image and one for its flip, those of indices 2i and 2i + 1
    (:func:`~mmwf.models.diffusion.index_generators`): images first, then flips, as the batch is laid out."""
    return index_generators(seed, [2 * int(i) + flip for flip in (0, 1) for i in indices], device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('images', help='ROOT/<class>/<images>')
    parser.add_argument('out', help='cache folder to write')
    parser.add_argument('--vae', required=True, help='local diffusers AutoencoderKL folder (sd-vae-ft-ema / -mse)')
    parser.add_argument('--size', type=int, default=256)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--num-workers', type=int, default=4)
    parser.add_argument('--seed', type=int, default=0, help='seed of the latent-distribution samples')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args()

    rank, world_size, args.device = init_tool_distributed(args.launcher, args.device)
    data = ClassFolderImages(args.images, args.size, flip=False)
    vae = FrozenVAE(args.vae)
    channels = load_vae(args.vae).config.latent_channels  # fails before any work when the folder is missing
    os.makedirs(args.out, exist_ok=True)
    tmp = osp.join(args.out, '.latents.npy.tmp')
    shape = (len(data), 2, channels, args.size // 8, args.size // 8)
    if rank == 0:
        np.lib.format.open_memmap(tmp, mode='w+', dtype=np.float16, shape=shape).flush()
    if world_size > 1:
        dist.barrier()
    latents = np.lib.format.open_memmap(tmp, mode='r+')
    mine = list(range(rank, len(data), world_size))
    loader = DataLoader(Subset(data, mine), batch_size=args.batch_size, num_workers=args.num_workers)
    done = 0
    for batch in loader:
        indices = torch.as_tensor(mine[done:done + len(batch['inputs'])])
        x = batch['inputs'].to(args.device).float() / 127.5 - 1
        z = vae.encode(torch.cat([x, x.flip(-1)]), generator=generators(args.seed, indices, args.device))
        latents[indices.numpy()] = torch.stack(z.cpu().to(torch.float16).chunk(2), 1).numpy()  # image, flip
        done += len(indices)
        print(f'rank {rank}: encoded {done} / {len(mine)}', flush=True)
    latents.flush()
    del latents
    if world_size > 1:
        dist.barrier()
    if rank == 0:
        os.replace(tmp, osp.join(args.out, 'latents.npy'))
        labels = np.array([label for _, label in data.items], dtype=np.int64)
        atomic_write(osp.join(args.out, 'labels.npy'), lambda f: np.save(f, labels))
        atomic_write(osp.join(args.out, 'classes.txt'), lambda f: f.write('\n'.join(data.classes) + '\n'), 'w')
        print(f'latent cache of {len(data)} images (and their flips) in {args.out}')
    if world_size > 1:
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
