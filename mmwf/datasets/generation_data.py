"""Data of class-conditional generation: an ImageNet-style class folder through ADM's centre crop (DiT's training
data), the latent cache that tools/generation/extract_latents.py writes (fast-DiT style), and the labels to sample
for evaluation. Items are ``dict(inputs=..., labels=int)`` (collate with mmengine's ``default_collate``)."""
from __future__ import annotations

import os
import os.path as osp

import numpy as np
import torch
from torch.utils.data import Dataset

from mmwf.registry import DATASETS
from mmwf.utils.arrays import load_arrays, read_image

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp')


def center_crop_arr(image, size: int) -> np.ndarray:
    """ADM's (and DiT's) crop of a PIL image: halve with a box filter while the short side is >= 2 ``size``, resize
    (bicubic) so that it is ``size``, then take the centre ``size`` x ``size``: uint8 (size, size, 3)."""
    from PIL import Image
    while min(image.size) >= 2 * size:
        image = image.resize(tuple(x // 2 for x in image.size), resample=Image.BOX)
    scale = size / min(image.size)
    image = image.resize(tuple(round(x * scale) for x in image.size), resample=Image.BICUBIC)
    arr = np.array(image.convert('RGB'))
    top, left = (arr.shape[0] - size) // 2, (arr.shape[1] - size) // 2
    return arr[top:top + size, left:left + size]


def class_folder(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """``root/<class>/<image>`` as (sorted class names, [(path, class index)]), torchvision ImageFolder's order."""
    if not osp.isdir(root):
        raise FileNotFoundError(f'image folder {root!r} does not exist (expected ROOT/<class>/<images>, e.g. '
                                "ImageNet's train folder)")
    classes = sorted(d for d in os.listdir(root) if osp.isdir(osp.join(root, d)))
    items = [(osp.join(root, c, f), i) for i, c in enumerate(classes)
             for f in sorted(os.listdir(osp.join(root, c))) if f.lower().endswith(IMAGE_EXTENSIONS)]
    if not items:
        raise FileNotFoundError(f'no images under {root!r} (expected ROOT/<class>/<images>)')
    return classes, items


@DATASETS.register_module()
class ClassFolderImages(Dataset):
    """Images of a class folder, centre-cropped to ``size`` (:func:`center_crop_arr`) and flipped at random:
    ``inputs`` uint8 (3, size, size).

    Args:
        root (str): ``ROOT/<class>/<images>``.
        size (int): output side. Defaults to 256.
        flip (bool): random horizontal flip (p = 0.5). Defaults to True.
    """

    def __init__(self, root: str, size: int = 256, flip: bool = True) -> None:
        self.root, self.size, self.flip = root, size, flip
        self.classes, self.items = class_folder(root)
        self.metainfo = dict(classes=tuple(self.classes))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        path, label = self.items[i]
        arr = center_crop_arr(read_image(path), self.size)
        if self.flip and np.random.rand() < 0.5:
            arr = arr[:, ::-1]
        return dict(inputs=torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1), labels=label)


@DATASETS.register_module()
class LatentCacheDataset(Dataset):
    """The latent cache of tools/generation/extract_latents.py: ``latents.npy`` (N, 2, C, h, w) float16, the
    scaled VAE latents of each image and of its horizontal flip, ``labels.npy`` (N,) and ``classes.txt``; each item
    takes one of the two at random (the random flip of DiT's data).

    Args:
        root (str): the cache folder.
        flip (bool): pick the flipped copy with p = 0.5 (else always the original). Defaults to True.
    """

    def __init__(self, root: str, flip: bool = True) -> None:
        files = [osp.join(root, f) for f in ('latents.npy', 'labels.npy', 'classes.txt')]
        missing = [f for f in files if not osp.isfile(f)]
        if missing:
            raise FileNotFoundError(f'latent cache {root!r} lacks {", ".join(map(osp.basename, missing))}: write it '
                                    'with python tools/generation/extract_latents.py IMAGE_FOLDER ' + root)
        rewrite = 'Rewrite the cache with python tools/generation/extract_latents.py.'
        self.latents = load_arrays(files[0], mmap=True, fix=rewrite)
        self.labels = load_arrays(files[1], fix=rewrite)
        if self.latents.ndim != 5 or self.latents.shape[1] != 2 or len(self.labels) != len(self.latents):
            raise ValueError(f'{files[0]} has shape {self.latents.shape} for {len(self.labels)} labels; expected '
                             '(N, 2, C, h, w) for N labels (rewrite the cache with extract_latents.py)')
        with open(files[2]) as f:
            self.metainfo = dict(classes=tuple(line.strip() for line in f if line.strip()))
        self.flip = flip

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        copy = int(self.flip and np.random.rand() < 0.5)
        return dict(inputs=torch.from_numpy(np.array(self.latents[i, copy], dtype=np.float32)),
                    labels=int(self.labels[i]))


@DATASETS.register_module()
class SamplingLabels(Dataset):
    """The class labels to sample for evaluation: ``num_samples`` labels drawn uniformly (seeded), as DiT's
    sample_ddp.py draws them; ``balanced=True`` takes every class equally often instead.

    Args:
        num_samples (int): samples. Defaults to 50000 (FID-50K).
        num_classes (int): classes. Defaults to 1000.
        seed (int): seed of the draw. Defaults to 0.
        balanced (bool): i % num_classes instead of a random draw. Defaults to False.
        classes (Sequence[str], optional): class names for ``metainfo`` (then checked against the checkpoint's).
            Defaults to None.
    """

    def __init__(self, num_samples: int = 50000, num_classes: int = 1000, seed: int = 0, balanced: bool = False,
                 classes: tuple | list | None = None) -> None:
        if balanced:
            self.labels = np.arange(num_samples) % num_classes
        else:
            self.labels = np.random.default_rng(seed).integers(0, num_classes, num_samples)
        # unnamed: no class list to compare; num_samples for GenerationMetric (score parts, sample count)
        self.metainfo = dict(num_samples=num_samples, **(dict(classes=tuple(classes)) if classes else {}))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return dict(labels=int(self.labels[i]), indices=i)  # the index seeds the sample's noise
