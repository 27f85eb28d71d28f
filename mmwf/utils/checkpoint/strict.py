"""Strict loading, in one place: what does not fit the model (missing, unexpected, mis-shaped keys) taken from the
load itself, after the modules' own load hooks (renamed keys, resampled position tables, old state-dict versions)
have run, and named in one error.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn

from .errors import CheckpointMismatchError
from .read import modules_of


class Mismatch(NamedTuple):
    """What of a state dict did not fit a model: keys the model has and the state lacks, keys the model does not
    have, and ``'key: checkpoint (shape) vs model (shape)'`` lines; each sorted."""

    missing: list[str]
    unexpected: list[str]
    shapes: list[str]

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.shapes)


# set while load_checked loads: it reports every mismatch itself, so the modules' own guards stand aside
_checking = False


def in_checked_load() -> bool:
    """Whether :func:`load_checked` (which names every missing, unexpected and mis-shaped key) is loading."""
    return _checking


def load_checked(model: nn.Module, state: dict[str, torch.Tensor]) -> Mismatch:
    """Load the tensors of ``state`` that fit ``model`` (``load_state_dict(strict=False)``) and return what did not.

    Each module's load hooks run first; then a hook of ours, the last of each module, compares the shapes of the
    module's own tensors with the (possibly converted) state and takes the mis-shaped ones out before torch copies,
    so that they are reported as shape mismatches rather than raised or counted as missing."""
    shapes: dict[str, str] = {}

    def compare(module, state_dict, prefix, *args) -> None:
        own = {**module._parameters, **{k: v for k, v in module._buffers.items()
                                         if k not in module._non_persistent_buffers_set}}
        for name, tensor in own.items():
            key = prefix + name
            if tensor is not None and key in state_dict and isinstance(state_dict[key], torch.Tensor) \
                    and state_dict[key].shape != tensor.shape:
                shapes[key] = (f'{key}: checkpoint {tuple(state_dict.pop(key).shape)} vs model '
                               f'{tuple(tensor.shape)}')

    global _checking
    handles = [m.register_load_state_dict_pre_hook(compare) for m in model.modules()]
    saved, _checking = _checking, True
    try:
        result = model.load_state_dict(state, strict=False)
    finally:
        _checking = saved
        for handle in handles:
            handle.remove()
    return Mismatch(sorted(k for k in result.missing_keys if k not in shapes), sorted(result.unexpected_keys),
                    sorted(shapes.values()))


def _listing(keys: list[str], limit: int = 8) -> str:
    more = f' ... and {len(keys) - limit} more' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def mismatch_lines(mismatch: Mismatch) -> list[str]:
    """Lines naming missing, unexpected and mis-shaped keys (a few of each, and the counts; where the keys are
    many, the modules they are under)."""
    lines, limit = [], 8
    for kind, keys in (('missing keys', mismatch.missing), ('unexpected keys', mismatch.unexpected),
                       ('shape mismatches', mismatch.shapes)):
        if keys:
            where = f', under {modules_of(keys)}' if len(keys) > limit and kind != 'shape mismatches' else ''
            lines.append(f'{kind} ({len(keys)}{where}): {_listing(keys, limit)}')
    return lines


def state_dict_mismatch(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> Mismatch:
    """What of ``state`` does not fit the state dict ``own`` by key and shape alone, without loading (for tools
    that compare state dicts of two programs, not a state dict with a model)."""
    return Mismatch(sorted(set(own) - set(state)), sorted(set(state) - set(own)),
                    sorted(f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}'
                           for k in set(own) & set(state) if state[k].shape != own[k].shape))


def load_strict(model: nn.Module, state: dict[str, torch.Tensor], path: str, strict: bool = True) -> Mismatch:
    """Load ``state`` into ``model`` (:func:`load_checked`); with ``strict``, anything that does not fit is a
    :class:`CheckpointMismatchError` naming ``path`` and listing the keys. Returns the mismatch (empty when
    strict)."""
    mismatch = load_checked(model, state)
    if strict and mismatch:
        raise CheckpointMismatchError('\n'.join([f'{path!r} does not match {type(model).__name__} (is it a '
                                                 'checkpoint of this architecture and size?).',
                                                 *mismatch_lines(mismatch), *distiller_hint(state, path)]))
    return mismatch


def distiller_hint(state: dict[str, torch.Tensor], path: str) -> list[str]:
    """The way out when ``state`` is an attention-distillation run's (its keys under ``student.`` and ``teacher.``)
    and the model is not the distiller: the student written as a checkpoint of its own. Else nothing."""
    if not state or not all(key.startswith(('student.', 'teacher.')) for key in state):
        return []
    return [f'{path!r} is an AttentionDistiller checkpoint (keys under student. and teacher.): write its student as a '
            f'checkpoint of its own with tools/model_converters/extract_student.py {path} student.pth (--backbone: '
            'the backbone alone), then give student.pth']
