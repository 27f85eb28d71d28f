"""Reading numpy files (latent caches, sample batches, statistics) with errors that name the file, what is wrong
and the fix, as :mod:`mmwf.utils.checkpoint` does for checkpoints."""
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
