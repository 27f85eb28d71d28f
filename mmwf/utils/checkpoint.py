"""Weights-only checkpoint reading with errors that name the file, what is wrong with it and the fix.

torch >= 2.6 loads with ``weights_only=True``, which refuses every global that is not allow-listed. An mmengine
training checkpoint holds ``HistoryBuffer`` objects (numpy arrays inside) in its ``message_hub`` and numpy
scalars in ``meta``. We allow exactly those types. mmengine's own ``HistoryBuffer.__getstate__`` also pickles its
statistics functions, which unpickle through ``builtins.getattr``; allowing ``getattr`` would let a crafted file
call arbitrary code, so instead the buffer pickles only its data (the functions are class-level and restored on
load). ``import mmwf`` also routes mmengine's loading of local files (resume, ``load_from``, ``Pretrained``)
through :func:`load_weights_only`.
"""
from __future__ import annotations

import os
import re
import warnings

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader

REFETCH = 'Download or copy the file again.'
CLEAN = ('If it is a training checkpoint you trust, convert it once with '
         '`python tools/model_converters/clean_checkpoint.py SRC DST --trust-source`.')


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read; the message names the file, what was found and the fix."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holding a Python object that weights-only loading refuses (unpickling it could run code)."""


def _history_buffer_state(self: HistoryBuffer) -> dict:
    """Pickle a ``HistoryBuffer`` as plain data: its statistics methods are re-registered on load."""
    return {k: v for k, v in self.__dict__.items() if k != 'statistics_methods'}


def safe_checkpoint_globals() -> list:
    """The globals an mmengine checkpoint written by mmwf needs beyond torch's defaults.

    None of them runs code from the file: ``HistoryBuffer``'s own ``__setstate__`` stores the pickled data (its
    statistics functions are the class's, not the file's); ``_reconstruct``, ``scalar``, ``ndarray`` and the dtypes
    build numpy arrays and scalars from raw bytes; ``bytes`` rebuilds the empty byte string that pickle protocol 2
    writes as ``bytes()`` for a zero-size array's data, and can only return a byte string.
    """
    from numpy._core.multiarray import _reconstruct, scalar

    dtype_classes = [t for t in vars(np.dtypes).values()
                     if isinstance(t, type) and issubclass(t, np.dtype)]
    return [HistoryBuffer, _reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes, bytes]


def _mmengine_load_from_local(filename: str, map_location: str | torch.device | None = None) -> dict:
    """mmengine's loader of local files, weights-only and with :func:`load_weights_only`'s errors."""
    return load_weights_only(os.path.expanduser(filename), map_location or 'cpu')


def enable_safe_mmengine_checkpoints() -> None:
    """Make mmengine checkpoints load under ``weights_only=True`` with clear errors (idempotent; called by
    ``import mmwf``). With ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` set it warns: that variable makes ``torch.load``
    calls that do not pass ``weights_only`` unpickle code, but every load of mmwf and mmengine passes it."""
    if os.environ.get('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '0').lower() not in ('', '0', 'false', 'off', 'no'):
        warnings.warn('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set: torch.load calls that do not pass weights_only run '
                      'code stored in checkpoints. mmwf and mmengine checkpoints still load weights-only; unset it '
                      'unless another tool needs it.', stacklevel=2)
    HistoryBuffer.__getstate__ = _history_buffer_state
    torch.serialization.add_safe_globals(safe_checkpoint_globals())
    CheckpointLoader.register_scheme(prefixes='', loader=_mmengine_load_from_local, force=True)


def _unreadable(path: str, err: Exception) -> CheckpointError:
    """Why ``path`` could not be read, as one error that names the file, what was found and the fix."""
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
        head = f.read(12)
    message = str(err).strip().splitlines()[-1].split('. ')[0] if str(err).strip() else type(err).__name__
    error = CheckpointError
    if size == 0:
        what, fix = 'the file is empty (0 bytes)', REFETCH
    elif path.endswith('.safetensors'):
        what, fix = f'its safetensors header is corrupt or the file is truncated ({message}; {size} bytes)', REFETCH
    elif not head.startswith(b'PK\x03\x04') and head[:1] != b'\x80':  # neither zip (torch >= 1.6) nor pickle
        what = f'it is not a PyTorch or safetensors checkpoint (no zip archive or pickle; it starts with {head!r})'
        fix = 'Check that the path points at the weights file (.pth / .safetensors).'
    elif 'Weights only load failed' in str(err) or 'Unsupported global' in str(err):
        refused = re.search(r'GLOBAL (\S+) was not an allowed global|Unsupported operand \d+', str(err))
        error, fix = UnsafeCheckpointError, CLEAN
        found = (refused.group(1) or refused.group(0)) if refused else message
        what = f'it holds a Python object that weights-only loading refuses ({found})'
    elif head.startswith(b'PK\x03\x04'):
        what = f'the zip archive is truncated or damaged ({size} bytes: {message})'
        fix = f'{REFETCH} A run killed while saving leaves such a file: resume from an earlier checkpoint.'
    else:
        what, fix = f'the pickle stream is truncated or damaged ({size} bytes: {message})', REFETCH
    return error(f'cannot read checkpoint {path!r}: {what}. {fix}')


def _check_exists(path: str) -> None:
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path!r}. Check the path (relative paths are '
                                f'taken from {os.getcwd()!r}).')


def load_weights_only(path: str, map_location: str | torch.device = 'cpu') -> dict:
    """``torch.load(path, weights_only=True)``; a missing or unreadable file raises an error that names the file,
    what is wrong with it (empty, truncated, not a checkpoint, a refused object type) and the fix."""
    _check_exists(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise _unreadable(path, err) from err


def load_state_dict_file(path: str) -> dict[str, torch.Tensor]:
    """Read the tensors of a checkpoint file: ``.safetensors``, or a torch file loaded weights-only whose
    tensors sit at the top level or under ``state_dict`` / ``model`` / ``module`` (mmengine, the
    WeightFormer and DeiT releases)."""
    if path.endswith('.safetensors'):
        _check_exists(path)
        from safetensors.torch import load_file
        try:
            return load_file(path)
        except Exception as err:
            raise _unreadable(path, err) from err
    ckpt = load_weights_only(path)
    for key in ('state_dict', 'model', 'module'):
        if isinstance(ckpt, dict) and isinstance(ckpt.get(key), dict):
            ckpt = ckpt[key]
            break
    if not isinstance(ckpt, dict) or not ckpt or not all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        found = type(ckpt).__name__ if not isinstance(ckpt, dict) else (
            'an empty dict' if not ckpt else
            f"a dict whose entries are not all tensors: {', '.join(sorted(map(str, ckpt))[:5])}"
            f"{', ...' if len(ckpt) > 5 else ''}")
        raise CheckpointError(f'cannot read checkpoint {path!r}: it is not a state dict (found {found}; expected '
                              "names mapped to tensors, at the top level or under 'state_dict' / 'model'). Check "
                              'that the path points at model weights, not another kind of file.')
    return ckpt
