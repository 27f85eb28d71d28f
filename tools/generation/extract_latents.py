"""Encode an ImageNet-style class folder once into the latent cache that LatentCacheDataset reads (fast-DiT style):
each image through ADM's centre crop, encoded by the VAE (a latent-distribution sample x 0.18215) together with its
horizontal flip. Writes OUT/latents.npy (N, 2, 4, size/8, size/8) float16, OUT/labels.npy and OUT/classes.txt.

    python tools/generation/extract_latents.py data/imagenet/train data/imagenet256_latents \
        --vae checkpoints/sd-vae-ft-ema --size 256 --device cuda
"""
from __future__ import annotations

import argparse
import os
import os.path as osp

import numpy as np
import torch
from torch.utils.data import DataLoader

from mmwf.datasets import ClassFolderImages
from mmwf.models.diffusion import FrozenVAE, load_vae
from mmwf.utils.checkpoint import atomic_write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('images', help='ROOT/<class>/<images>')
    parser.add_argument('out', help='cache folder to write')
    parser.add_argument('--vae', required=True, help='local diffusers AutoencoderKL folder (sd-vae-ft-ema / -mse)')
    parser.add_argument('--size', type=int, default=256)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--num-workers', type=int, default=4)
    parser.add_argument('--seed', type=int, default=0, help='seed of the latent-distribution samples')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args()

    data = ClassFolderImages(args.images, args.size, flip=False)
    vae = FrozenVAE(args.vae)
    load_vae(args.vae)  # fails before any work when the folder is missing
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    latents = None
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=args.num_workers)
    done = 0
    for batch in loader:
        x = batch['inputs'].to(args.device).float() / 127.5 - 1
        z = vae.encode(torch.cat([x, x.flip(-1)])).cpu().to(torch.float16)
        z = torch.stack(z.chunk(2), 1).numpy()  # (B, 2, C, h, w): image, flip
        if latents is None:
            latents = np.lib.format.open_memmap(osp.join(args.out, '.latents.npy.tmp'), mode='w+',
                                                dtype=np.float16, shape=(len(data), *z.shape[1:]))
        latents[done:done + len(z)] = z
        done += len(z)
        print(f'encoded {done} / {len(data)}', flush=True)
    latents.flush()
    del latents
    os.replace(osp.join(args.out, '.latents.npy.tmp'), osp.join(args.out, 'latents.npy'))
    labels = np.array([label for _, label in data.items], dtype=np.int64)
    atomic_write(osp.join(args.out, 'labels.npy'), lambda f: np.save(f, labels))
    atomic_write(osp.join(args.out, 'classes.txt'), lambda f: f.write('\n'.join(data.classes) + '\n'), 'w')
    print(f'latent cache of {len(data)} images (and their flips) in {args.out}')


if __name__ == '__main__':
    main()
