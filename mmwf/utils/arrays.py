"""Reading images and numpy files (latent caches, sample batches, statistics) with errors that name the file, what
is wrong and the fix, as :mod:`mmwf.utils.checkpoint` does for checkpoints; and the check of an image array."""
from __future__ import annotations

import os
import zipfile

import numpy as np


def load_arrays(path: str, keys: tuple[str, ...] = (), mmap: bool = False, fix: str = 'Write the file again.'):
    """``np.load(path)`` without pickles: an ``.npy`` array (memory-mapped with ``mmap``), or the arrays ``keys`` of
    an ``.npz`` as a dict. A missing, truncated or foreign file, or an ``.npz`` without one of ``keys``, raises an
    error naming the file and what is wrong, followed by ``fix``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'{path!r} not found. {fix}')
    try:
        loaded = np.load(path, mmap_mode='r' if mmap else None, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            return loaded
        with loaded:
            missing = [k for k in keys if k not in loaded.files]
            if missing:
                raise KeyError(f'it holds {sorted(loaded.files)}, not {missing}')
            return {k: loaded[k] for k in keys}
    except KeyError as err:
        what = err.args[0]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        what = (f'it is truncated or not a numpy file ({os.path.getsize(path)} bytes: '
                f'{str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__})')
    raise ValueError(f'cannot read {path!r}: {what}. {fix}')


def read_image(path: str):
    """The image at ``path`` as a PIL image in RGB, decoded whole here (PIL decodes lazily, so a truncated or damaged
    file would otherwise fail later without its name): a file that cannot be decoded is a ValueError naming it and
    the fault. The one image reader of the tools and datasets."""
    from PIL import Image, UnidentifiedImageError
    if not os.path.isfile(path):
        raise FileNotFoundError(f'image {path!r} not found')
    try:
        with Image.open(path) as image:
            return image.convert('RGB')
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as err:
        raise ValueError(f'cannot read image {path!r} ({os.path.getsize(path)} bytes): {err}. Remove the file or '
                         'replace it with a whole copy.') from None


def check_image_array(array: np.ndarray, where: str, layout: str = 'N x H x W x 3') -> None:
    """An array of images is uint8 in [0, 255] with ``layout`` (its last axis the 3 channels); anything else is a
    ValueError naming ``where``, what it holds and the conversion to apply."""
    if array.ndim != layout.count('x') + 1 or array.shape[-1] != 3:
        raise ValueError(f'{where} has shape {tuple(array.shape)}, not {layout} (RGB, channels last)')
    if array.dtype == np.uint8:
        return
    low, high = (float(array.min()), float(array.max())) if array.size else (0.0, 0.0)
    if array.dtype.kind == 'f' and low >= 0 and high <= 1:
        fix = ('np.clip(np.round(x * 255), 0, 255).astype(np.uint8) (floats in [0, 1], as '
               "DiTPipeline(output_type='np') gives)")
    elif array.dtype.kind == 'f' and low >= -1 and high <= 1:
        fix = 'np.clip(np.round((x + 1) * 127.5), 0, 255).astype(np.uint8) (floats in [-1, 1])'
    elif array.dtype.kind in 'iu' and low >= 0 and high <= 255:
        fix = 'x.astype(np.uint8) (integers in [0, 255])'
    else:
        fix = 'a conversion to uint8 in [0, 255] that fits how the images were written'
    raise ValueError(f'{where} is {array.dtype} in [{low:g}, {high:g}], not uint8 in [0, 255]: images of another '
                     f'scale would be measured wrongly. Convert it first: {fix}.')
