"""Weights-only checkpoint loading for mmengine checkpoints (torch >= 2.6).

torch >= 2.6 loads with ``weights_only=True`` by default, which refuses every global that is not
allow-listed. An mmengine training checkpoint holds ``HistoryBuffer`` objects (numpy arrays inside) in
its ``message_hub`` and numpy scalars in ``meta``. We allow exactly those types. mmengine's own
``HistoryBuffer.__getstate__`` also pickles its statistics functions, which unpickle through
``builtins.getattr``; allowing ``getattr`` would let a crafted file call arbitrary code, so instead the
buffer pickles only its data (the functions are class-level and restored on load).
"""
from __future__ import annotations

import os

import numpy as np
import torch
from mmengine.logging import HistoryBuffer


def _history_buffer_state(self: HistoryBuffer) -> dict:
    """Pickle a ``HistoryBuffer`` as plain data: its statistics methods are re-registered on load."""
    return {k: v for k, v in self.__dict__.items() if k != 'statistics_methods'}


def safe_checkpoint_globals() -> list:
    """The globals an mmengine checkpoint written by mmwf needs beyond torch's defaults."""
    from numpy._core.multiarray import _reconstruct, scalar

    dtype_classes = [t for t in vars(np.dtypes).values()
                     if isinstance(t, type) and issubclass(t, np.dtype)]
    return [HistoryBuffer, _reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes]


def enable_safe_mmengine_checkpoints() -> None:
    """Make mmengine checkpoints load under ``weights_only=True`` (idempotent; called by ``import mmwf``).

    Refuses to run when ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` is set, since that turns the check off.
    """
    if os.environ.get('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '0') not in ('', '0'):
        raise RuntimeError('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set: it makes torch.load run arbitrary '
                           'code from checkpoints. Unset it; mmwf loads mmengine checkpoints weights-only.')
    HistoryBuffer.__getstate__ = _history_buffer_state
    torch.serialization.add_safe_globals(safe_checkpoint_globals())


def load_weights_only(path: str, map_location: str | torch.device = 'cpu') -> dict:
    """``torch.load(path, weights_only=True)`` with errors that name the file and the fix."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path!r}. Check the path (relative paths are '
                                f'taken from {os.getcwd()!r}).')
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        if 'Weights only load failed' not in str(err) and 'Unsupported global' not in str(err):
            raise
        raise RuntimeError(
            f'{path!r} holds Python objects that weights-only loading refuses ({str(err).splitlines()[-1]}). '
            'If it is a training checkpoint you trust, convert it once with '
            '`python tools/model_converters/clean_checkpoint.py SRC DST --trust-source`.') from err


def load_state_dict_file(path: str) -> dict[str, torch.Tensor]:
    """Read the tensors of a checkpoint file: ``.safetensors``, or a torch file loaded weights-only whose
    tensors sit at the top level or under ``state_dict`` / ``model`` / ``module`` (mmengine, the
    WeightFormer and DeiT releases)."""
    if path.endswith('.safetensors'):
        if not os.path.isfile(path):
            raise FileNotFoundError(f'checkpoint not found: {path!r}.')
        from safetensors.torch import load_file
        return load_file(path)
    ckpt = load_weights_only(path)
    for key in ('state_dict', 'model', 'module'):
        if isinstance(ckpt, dict) and isinstance(ckpt.get(key), dict):
            ckpt = ckpt[key]
            break
    if not isinstance(ckpt, dict) or not all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        raise ValueError(f'{path!r} is not a state dict (a mapping of names to tensors, possibly under '
                         "'state_dict' or 'model').")
    return ckpt
