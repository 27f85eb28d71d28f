"""TF32 in CUDA float32 matmuls and cuDNN convolutions: read, set and put back through the API the running torch has
(:class:`~mmwf.engine.hooks.TF32Hook`, the analysis protocol, the fused linear's kernel).

torch >= 2.9 holds float32 precision per backend and operation: ``torch.backends.fp32_precision`` (every backend) ->
``torch.backends.cudnn.fp32_precision`` (all of CUDA's) -> ``torch.backends.cuda.matmul.fp32_precision``,
``torch.backends.cudnn.conv.fp32_precision``, ``torch.backends.cudnn.rnn.fp32_precision``: ``'tf32'``, ``'ieee'``
or ``'none'`` (the parent's), a read giving the value in force. The legacy flags (``torch.backends.cuda.matmul.
allow_tf32``, ``torch.backends.cudnn.allow_tf32``, ``torch.get_float32_matmul_precision()``) live beside them, and
torch refuses to read one ("a mix of the legacy and new APIs") once a script set the new API apart from it. So the
values in force are read through the new API, which never refuses; a switch is written in the new API, and in its
legacy flag too where that flag still reads, so that it keeps reading (torch 2.14's inductor itself reads
``get_float32_matmul_precision()`` for its autotuning cache keys); a legacy flag torch refuses to read is left as it
is. Torch without the new API: the legacy flags alone.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = ['TF32State', 'cudnn_tf32', 'matmul_tf32', 'restore_tf32', 'set_tf32', 'tf32']

# in each of torch's refusals to read a legacy flag that the new API was set apart from
_MIXED = 'of the legacy and new APIs'


def _new_api() -> bool:
    """Whether the running torch has the per-backend ``fp32_precision`` settings (setup.cfg's torch range has)."""
    return hasattr(torch.backends.cuda.matmul, 'fp32_precision')


def _legacy(switch: str):
    """What holds a switch's legacy ``allow_tf32`` flag."""
    return torch.backends.cuda.matmul if switch == 'matmul' else torch.backends.cudnn


def _settings(switch: str) -> tuple:
    """The new API's settings of a switch, each with its parent (whose value its ``'none'`` takes)."""
    backends = torch.backends
    if switch == 'matmul':
        return (backends.cuda.matmul, backends.cudnn),
    return (backends.cudnn.conv, backends.cudnn), (backends.cudnn.rnn, backends.cudnn)


def _read_legacy(read):
    """A legacy flag's value, or None where torch refuses the read (a script set the new API apart from it)."""
    try:
        return read()
    except RuntimeError as e:
        if _MIXED not in str(e):
            raise
        return None


def matmul_tf32() -> bool:
    """Whether CUDA float32 matmuls may use TF32: the value in force, read without a refusal."""
    if _new_api():
        return torch.backends.cuda.matmul.fp32_precision == 'tf32'
    return bool(torch.backends.cuda.matmul.allow_tf32)


def cudnn_tf32() -> bool:
    """Whether cuDNN's float32 convolutions may use TF32: the value in force, read without a refusal."""
    if _new_api():
        return torch.backends.cudnn.conv.fp32_precision == 'tf32'
    return bool(torch.backends.cudnn.allow_tf32)


@dataclass(frozen=True)
class _Found:
    """A switch that :func:`set_tf32` wrote, as it found it: ``legacy`` the legacy flag (None: torch refused the
    read, and it was left alone; ``'medium'``: matmul's ``set_float32_matmul_precision('medium')``, which the flag
    alone cannot put back), ``settings`` the new API's settings with their own values, empty on older torch."""
    legacy: bool | str | None
    settings: tuple = ()


@dataclass(frozen=True)
class TF32State:
    """What :func:`set_tf32` found of each switch it wrote (None: not asked, or already as asked)."""
    matmul: _Found | None = None
    cudnn: _Found | None = None


def _own(setting, parent, parent_own: str) -> str:
    """A setting's own value, ``'none'`` where it takes its parent's. Where the two read alike, the parent is set to
    another value for a look and put back (``parent_own``: the parent's own value)."""
    value = setting.fp32_precision
    if value == 'none' or value != parent.fp32_precision:
        return value
    parent.fp32_precision = 'ieee' if value == 'tf32' else 'tf32'
    try:
        follows = setting.fp32_precision != value
    finally:
        parent.fp32_precision = parent_own
    return 'none' if follows else value


def _set(switch: str, on: bool) -> _Found | None:
    if not _new_api():
        found = bool(_legacy(switch).allow_tf32)
        if found == on:
            return None
        _legacy(switch).allow_tf32 = on
        return _Found(found)
    settings = _settings(switch)
    if all((setting.fp32_precision == 'tf32') == on for setting, _ in settings):
        return None  # already in force: nothing written, nothing to put back
    legacy = _read_legacy(lambda: _legacy(switch).allow_tf32)
    cuda = _own(torch.backends.cudnn, torch.backends, torch.backends.fp32_precision)  # the settings' parent
    found = tuple((setting, _own(setting, parent, cuda)) for setting, parent in settings)
    if switch == 'matmul' and legacy and _read_legacy(torch.get_float32_matmul_precision) == 'medium':
        # set_float32_matmul_precision('medium') puts it back, and sets oneDNN's matmul too: that one follows its
        # parent again where it reads as the parent does (its parent cannot be set apart for a look)
        legacy, mkldnn = 'medium', torch.backends.mkldnn
        value = mkldnn.matmul.fp32_precision
        found += (mkldnn.matmul, 'none' if value == mkldnn.fp32_precision else value),
    if legacy is not None:  # it reads: keep it reading, in step with the new API
        _legacy(switch).allow_tf32 = on
    for setting, _ in settings:  # explicitly: a 'none' would take a parent's TF32
        setting.fp32_precision = 'tf32' if on else 'ieee'
    return _Found(legacy, found)


def _restore(switch: str, found: _Found) -> None:
    if found.legacy == 'medium':
        torch.set_float32_matmul_precision('medium')
    elif found.legacy is not None:
        _legacy(switch).allow_tf32 = found.legacy
    for setting, value in found.settings:
        setting.fp32_precision = value


def set_tf32(matmul: bool | None = None, cudnn: bool | None = None) -> TF32State:
    """TF32 on or off in CUDA float32 matmuls (``matmul``) and in cuDNN's float32 convolutions and RNNs (``cudnn``),
    None leaving a switch alone; a switch already as asked is not written. Returns what it found, for
    :func:`restore_tf32`. One legacy read has no value for a state this makes: CUDA matmul off while oneDNN's CPU
    matmul is TF32 or bf16 (``set_float32_matmul_precision('high' / 'medium')`` before), where torch refuses
    ``get_float32_matmul_precision()`` until the settings are put back."""
    return TF32State(None if matmul is None else _set('matmul', matmul),
                     None if cudnn is None else _set('cudnn', cudnn))


def restore_tf32(state: TF32State) -> None:
    """Put back what :func:`set_tf32` found: each setting and flag it wrote reads as before, a legacy flag torch
    refused to read then (left alone) still refuses, and a setting that took its parent's value takes it again. One
    state has no value a script can write: torch's initial cuDNN conv / RNN setting ('tf32' until a parent is set,
    then the parent's); once written, it comes back as the value it read."""
    for switch in ('cudnn', 'matmul'):
        found = getattr(state, switch)
        if found is not None:
            _restore(switch, found)


@contextmanager
def tf32(matmul: bool | None = None, cudnn: bool | None = None) -> Iterator[TF32State]:
    """:func:`set_tf32` for the block, put back on exit."""
    state = set_tf32(matmul, cudnn)
    try:
        yield state
    finally:
        restore_tf32(state)
