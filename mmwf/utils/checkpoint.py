"""Checkpoints, in one place: weights-only reading with errors that name the file, what is wrong with it and
the fix; unwrapping to a state dict; strict loading with key lists; the ``StrictPretrained`` initializer.

torch >= 2.6 loads with ``weights_only=True``, which refuses every global that is not allow-listed. An mmengine
training checkpoint holds ``HistoryBuffer`` objects (numpy arrays inside) in its ``message_hub`` and numpy
scalars in ``meta``. We allow exactly those types. mmengine's own ``HistoryBuffer.__getstate__`` also pickles its
statistics functions, which unpickle through ``builtins.getattr``; allowing ``getattr`` would let a crafted file
call arbitrary code, so instead the buffer pickles only its data (the functions are class-level and restored on
load). ``import mmwf`` also routes mmengine's loading of local files (resume, ``load_from``, ``Pretrained``)
through :func:`load_weights_only`.

Backbones load released weights strictly: a family's ``checkpoint_filter_fn`` maps a checkpoint to the model's
keys (timm's pattern), then every key must match (:func:`load_strict`).
"""
from __future__ import annotations

import os
import re
import warnings

import numpy as np
import torch
import torch.nn as nn
from mmengine.logging import HistoryBuffer, print_log
from mmengine.runner import CheckpointLoader

from mmwf.registry import WEIGHT_INITIALIZERS

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


def unwrap_state_dict(ckpt: object, path: str) -> dict[str, torch.Tensor]:
    """The tensors of a loaded checkpoint: at the top level or under ``state_dict`` / ``model`` / ``module``
    (mmengine, the WeightFormer and DeiT releases); anything else is a :class:`CheckpointError` naming ``path``."""
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


def load_state_dict_file(path: str) -> dict[str, torch.Tensor]:
    """Read the tensors of a checkpoint file: ``.safetensors``, or a torch file loaded weights-only and unwrapped
    by :func:`unwrap_state_dict`."""
    if path.endswith('.safetensors'):
        _check_exists(path)
        from safetensors.torch import load_file
        try:
            return load_file(path)
        except Exception as err:
            raise _unreadable(path, err) from err
    return unwrap_state_dict(load_weights_only(path), path)


def read_state_dict(path: str, prefix: str | None = None, hint: str = '') -> dict[str, torch.Tensor]:
    """:func:`load_state_dict_file`, keeping only the keys under ``prefix`` (stripped). Without a prefix, a
    checkpoint whose keys all start with ``backbone.`` (a detector's or segmentor's) is unwrapped. ``hint`` is
    added to the not-found error (where to get the weights)."""
    try:
        state = load_state_dict_file(path)
    except FileNotFoundError as err:
        raise FileNotFoundError(f'{err} {hint}'.strip()) from None
    if prefix is None and all(k.startswith('backbone.') for k in state):
        prefix = 'backbone.'
    if prefix:
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if not state:
            raise CheckpointError(f'cannot read checkpoint {path!r}: it has no keys under prefix {prefix!r}. Set '
                                  "the init_cfg's prefix to where the backbone's keys are, or leave it out.")
    return state


def _listing(keys: list[str], limit: int = 20) -> str:
    more = f' ... and {len(keys) - limit} more' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def load_strict(model: nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    """Load ``state`` into ``model``; any missing, unexpected or mis-shaped key is a ``ValueError`` listing them."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = sorted(f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}'
                        for k in set(own) & set(state) if state[k].shape != own[k].shape)
    if missing or unexpected or mismatched:
        lines = [f'{path!r} does not match {type(model).__name__} (is it a checkpoint of this architecture '
                 'and size?).']
        if missing:
            lines.append(f'missing keys ({len(missing)}): {_listing(missing)}')
        if unexpected:
            lines.append(f'unexpected keys ({len(unexpected)}): {_listing(unexpected)}')
        if mismatched:
            lines.append(f'shape mismatches ({len(mismatched)}): {_listing(mismatched)}')
        raise ValueError('\n'.join(lines))
    model.load_state_dict(state, strict=True)


def load_pretrained(model: nn.Module, path: str, prefix: str | None = None) -> None:
    """Read ``path`` (see :func:`read_state_dict`), map it with the model's ``checkpoint_filter_fn`` when it has
    one, and load it strictly."""
    hint = f"{getattr(model, 'WEIGHTS_HINT', '')} To train from scratch instead, set the backbone's init_cfg=None."
    state = read_state_dict(path, prefix, hint.strip())
    filter_fn = getattr(model, 'checkpoint_filter_fn', None)
    if filter_fn is not None:
        state = filter_fn(state)
    load_strict(model, state, path)
    print_log(f'loaded {len(state)} tensors into {type(model).__name__} from {path}', logger='current')


@WEIGHT_INITIALIZERS.register_module()
class StrictPretrained:
    """Initializer loading a checkpoint strictly (:func:`load_pretrained`), where mmengine's ``Pretrained`` skips
    what does not match. mmwf's backbones turn ``dict(type='Pretrained', ...)`` into this one.

    Args:
        checkpoint (str): ``.pth`` (read weights-only) or ``.safetensors`` file.
        prefix (str, optional): keep only the keys under this prefix (e.g. ``'backbone.'``). Defaults to None.
    """

    def __init__(self, checkpoint: str, prefix: str | None = None) -> None:
        self.checkpoint, self.prefix = checkpoint, prefix

    def __call__(self, module: nn.Module) -> None:
        load_pretrained(module, self.checkpoint, self.prefix)


def strict_pretrained(init_cfg: dict | list | None) -> dict | list | None:
    """``init_cfg`` (a dict or a list) with every ``Pretrained`` entry made :class:`StrictPretrained`."""
    def convert(cfg: dict) -> dict:
        return dict(cfg, type='StrictPretrained') if cfg.get('type') == 'Pretrained' else cfg
    if isinstance(init_cfg, (list, tuple)):
        return [convert(c) for c in init_cfg]
    return convert(init_cfg) if isinstance(init_cfg, dict) else init_cfg
