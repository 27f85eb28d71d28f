"""Images for the analysis tools (erf.py, dynamic_strength.py)."""
from __future__ import annotations

import glob
import os.path as osp

import torch

from mmwf.utils.arrays import read_image

# where tools/generate_demo_data.py writes its COCO-style validation images, relative to the working directory
DEMO_IMAGES = osp.join('data', 'demo', 'coco', 'val')


def load_images(folder: str, size: int, limit: int) -> torch.Tensor:
    """Up to ``limit`` .jpg / .png images of ``folder`` (sorted by name), resized to ``size`` x ``size`` and
    normalised with ImageNet's mean and std: (B, 3, size, size)."""
    import cv2
    import numpy as np
    files = sorted(f for ext in ('jpg', 'jpeg', 'png') for f in glob.glob(osp.join(folder, f'*.{ext}')))[:limit]
    if not files:
        hint = (' (the demo images: write them with python tools/generate_demo_data.py)'
                if osp.normpath(folder) == osp.normpath(DEMO_IMAGES) else '')
        raise FileNotFoundError(f'no .jpg / .png images in {folder!r}{hint}; give --images a folder of images')
    mean, std = np.array([123.675, 116.28, 103.53]), np.array([58.395, 57.12, 57.375])
    images = [(cv2.resize(np.asarray(read_image(f)), (size, size), interpolation=cv2.INTER_LINEAR) - mean) / std
              for f in files]
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float()
