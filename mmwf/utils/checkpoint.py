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
keys (timm's pattern), then every key must match (:func:`load_strict`). Checkpoints of a whole detector,
segmentor, classifier or distiller load into a backbone by their ``backbone.`` (``student.backbone.``) keys.

Writes are atomic (:func:`atomic_save`, and mmengine's local file backend, which the runner saves through): a
temporary file in the same folder, flushed and fsynced, then renamed over the target. A run killed while saving
leaves the previous file intact. URLs and mmengine's ``torchvision://`` / ``open-mmlab://`` / ``mmcls://`` names
are downloaded into torch's hub cache and read weights-only as well.
"""
from __future__ import annotations

import os
import re
import stat
import uuid
import warnings
from collections.abc import Callable
from urllib.error import URLError
from urllib.parse import urlparse

import numpy as np
import torch
import torch.nn as nn
from mmengine.fileio.backends import LocalBackend, register_backend
from mmengine.logging import HistoryBuffer, print_log
from mmengine.runner import CheckpointLoader

from mmwf.registry import WEIGHT_INITIALIZERS

REFETCH = 'Download or copy the file again.'
CLEAN = ('If it is a training checkpoint you trust, convert it once with '
         '`python tools/model_converters/clean_checkpoint.py SRC DST --trust-source`.')


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read; the message names the file, what was found and the fix, and
    ``what`` holds what was found alone."""

    def __init__(self, message: str, what: str | None = None) -> None:
        super().__init__(message)
        self.what = what or message


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
    """mmengine's loader of local files, weights-only and with :func:`load_weights_only`'s errors; ``.safetensors``
    files (the released weights) are read as such."""
    path = os.path.expanduser(filename)
    if path.endswith('.safetensors'):
        return load_state_dict_file(path, map_location or 'cpu')
    return load_weights_only(path, map_location or 'cpu')


def atomic_write(path: str, write: Callable, mode: str = 'wb') -> None:
    """Write a file so that it is either the old or the complete new one, never a part: ``write(f)`` fills a
    temporary file ``.NAME.XXXXXXXX.tmp`` in the same folder, which is flushed, fsynced and renamed over ``path``
    (keeping an existing file's permission bits; then the folder is fsynced). A path that exists but is not a
    regular file (a device, a link), or a folder where no file can be created, is written in place."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f'.{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp')
    in_place = os.path.lexists(path) and (os.path.islink(path) or not os.path.isfile(path))
    if not in_place:
        try:
            f = open(tmp, mode)
        except PermissionError:
            in_place = True
    if in_place:
        with open(path, mode) as f:
            write(f)
        return
    try:
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if os.path.isfile(path):
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder that cannot be opened (some network file systems): the rename is done
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj: object, path: str) -> None:
    """``torch.save(obj, path)`` through :func:`atomic_write`: a killed process leaves no partial file."""
    atomic_write(path, lambda f: torch.save(obj, f))


CHECKPOINT_SUFFIXES = ('.pth', '.pt', '.ckpt', '.safetensors')


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend, writing checkpoints atomically (:func:`atomic_write`). The runner saves them
    through ``put``; mmengine's own backend opens the target and writes into it, so a run killed while saving
    leaves a truncated checkpoint where the previous one was. Other files (results, pictures) are written as
    mmengine writes them, without the fsyncs."""

    def put(self, obj: bytes, filepath: str) -> None:
        if str(filepath).endswith(CHECKPOINT_SUFFIXES):
            atomic_write(str(filepath), lambda f: f.write(obj))
        else:
            super().put(obj, filepath)


def _download(url: str) -> str:
    """The local copy of ``url`` in torch's hub cache (``$TORCH_HOME/hub/checkpoints``), downloaded by the first
    process of each node while the others wait, as mmengine's loader does; a failure names the address."""
    from mmengine.dist import barrier, get_dist_info, get_local_rank
    from torch.hub import download_url_to_file, get_dir
    cached = os.path.join(get_dir(), 'checkpoints', os.path.basename(urlparse(url).path) or 'checkpoint.pth')
    if get_local_rank() == 0 and not os.path.isfile(cached):
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        print_log(f'downloading {url} to {cached}', logger='current')
        try:
            download_url_to_file(url, cached, progress=False)  # into a temporary file, moved when complete
        except (URLError, OSError, ValueError) as err:
            raise FileNotFoundError(f'cannot download checkpoint {url!r}: {getattr(err, "reason", err)}. Check the '
                                    'address and the network, or download the file yourself and give its local '
                                    'path.') from err
    if get_dist_info()[1] > 1:
        barrier()
    return cached


def _load_from_url(url: str, map_location: str | torch.device | None = None) -> dict:
    """mmengine's ``http(s)://`` loader, weights-only (mmengine's goes through ``torch.hub``, which unpickles
    with ``weights_only=False``)."""
    return load_weights_only(_download(url), map_location or 'cpu')


def _named_url(scheme: str, name: str, table: dict) -> str:
    if name not in table:
        import difflib
        close = difflib.get_close_matches(name, list(table), n=3)
        raise KeyError(f'{scheme}{name} is not a checkpoint mmengine knows; '
                       + (f'did you mean {" or ".join(close)}?' if close else
                          f'{scheme} names: {", ".join(sorted(table)[:12])}{" ..." if len(table) > 12 else ""}'))
    return table[name]


def _load_from_torchvision(filename: str, map_location: str | torch.device | None = None) -> dict:
    """``torchvision://NAME`` (and the deprecated ``modelzoo://NAME``), weights-only."""
    from mmengine.runner.checkpoint import get_torchvision_models
    scheme, name = filename.split('://', 1)
    return _load_from_url(_named_url(f'{scheme}://', name, get_torchvision_models()), map_location)


def _load_from_openmmlab(filename: str, map_location: str | torch.device | None = None) -> dict:
    """``open-mmlab://NAME`` / ``openmmlab://NAME``: a URL, or a file under mmengine's home, weights-only."""
    from mmengine.runner.checkpoint import _get_mmengine_home, get_deprecated_model_names, get_external_models
    scheme, name = filename.split('://', 1)
    name = get_deprecated_model_names().get(name, name)
    url = _named_url(f'{scheme}://', name, get_external_models())
    if url.startswith(('http://', 'https://')):
        return _load_from_url(url, map_location)
    return load_weights_only(os.path.join(_get_mmengine_home(), url), map_location or 'cpu')


def _load_from_mmcls(filename: str, map_location: str | torch.device | None = None) -> dict:
    """``mmcls://NAME``, weights-only, its keys converted as mmengine converts them."""
    from mmengine.runner.checkpoint import _process_mmcls_checkpoint, get_mmcls_models
    name = filename.split('://', 1)[1]
    return _process_mmcls_checkpoint(_load_from_url(_named_url('mmcls://', name, get_mmcls_models()), map_location))


def enable_safe_mmengine_checkpoints() -> None:
    """Make mmengine checkpoints load under ``weights_only=True`` with clear errors, from local files and from
    every download scheme mmengine knows, and make its local writes atomic (idempotent; called by ``import mmwf``).
    With ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` set it warns: that variable makes ``torch.load`` calls that do not
    pass ``weights_only`` unpickle code, but every load of mmwf and mmengine passes it."""
    if os.environ.get('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '0').lower() not in ('', '0', 'false', 'off', 'no'):
        warnings.warn('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set: torch.load calls that do not pass weights_only run '
                      'code stored in checkpoints. mmwf and mmengine checkpoints still load weights-only; unset it '
                      'unless another tool needs it.', stacklevel=2)
    HistoryBuffer.__getstate__ = _history_buffer_state
    torch.serialization.add_safe_globals(safe_checkpoint_globals())
    for prefixes, loader in (('', _mmengine_load_from_local), (('http://', 'https://'), _load_from_url),
                             (('torchvision://', 'modelzoo://'), _load_from_torchvision),
                             (('open-mmlab://', 'openmmlab://'), _load_from_openmmlab),
                             ('mmcls://', _load_from_mmcls)):
        CheckpointLoader.register_scheme(prefixes=prefixes, loader=loader, force=True)
    register_backend('local', AtomicLocalBackend, force=True, prefixes='')


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
    return error(f'cannot read checkpoint {path!r}: {what}. {fix}', what)


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


def load_state_dict_file(path: str, map_location: str | torch.device = 'cpu') -> dict[str, torch.Tensor]:
    """Read the tensors of a checkpoint: a local ``.safetensors`` file, a local torch file loaded weights-only, or
    any address mmengine's ``CheckpointLoader`` knows (``https://``, ``torchvision://``, ``open-mmlab://``, ...),
    unwrapped by :func:`unwrap_state_dict`."""
    if '://' in path:
        return unwrap_state_dict(CheckpointLoader.load_checkpoint(path, map_location), path)
    if path.endswith('.safetensors'):
        _check_exists(path)
        from safetensors.torch import load_file
        try:
            return load_file(path, device=str(map_location))
        except Exception as err:
            raise _unreadable(path, err) from err
    return unwrap_state_dict(load_weights_only(path, map_location), path)


# where a backbone's tensors sit in a whole-model checkpoint: a distiller's student, or a detector / segmentor /
# classifier (mmdet, mmseg, mmpretrain all name the module ``backbone``)
WHOLE_MODEL_PREFIXES = ('student.backbone.', 'backbone.')


def _modules(keys: list[str]) -> str:
    names = sorted({'.'.join(k.split('.')[:2 if k.startswith(('student.', 'teacher.')) else 1]) for k in keys})
    return ', '.join(f'{n}.*' for n in names[:6]) + (' ...' if len(names) > 6 else '')


def read_state_dict(path: str, prefix: str | None = None, hint: str = '',
                    map_location: str | torch.device = 'cpu') -> dict[str, torch.Tensor]:
    """:func:`load_state_dict_file`, keeping only the keys under ``prefix`` (stripped; with or without its dot, as
    mmengine's ``Pretrained``). Without a prefix, a whole-model checkpoint is reduced to its backbone: the
    ``student.backbone.`` keys of a distiller, else the ``backbone.`` keys of a detector, segmentor or classifier
    (logged). ``hint`` is added to the not-found error (where to get the weights)."""
    try:
        state = load_state_dict_file(path, map_location)
    except FileNotFoundError as err:
        raise FileNotFoundError(f'{err} {hint}'.strip()) from None
    whole = prefix is None
    if whole:
        prefix = next((p for p in WHOLE_MODEL_PREFIXES if any(k.startswith(p) for k in state)), None)
    elif prefix and not prefix.endswith('.'):
        prefix += '.'
    if not prefix:
        return state
    kept = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not kept:
        raise CheckpointError(f'cannot read checkpoint {path!r}: it has no keys under prefix {prefix!r} (its keys '
                              f'start with {_modules(list(state))}). Set the init_cfg\'s prefix to where the '
                              "backbone's keys are, or leave it out.")
    if whole:
        others = [k for k in state if not k.startswith(prefix)]
        print_log(f'{path}: a whole-model checkpoint; using its {len(kept)} {prefix!r} tensors'
                  + (f', not the {len(others)} of {_modules(others)}' if others else ''), logger='current')
    return kept


class CheckpointMismatchError(ValueError):
    """A readable checkpoint that does not fit the model; the message names the file and lists the keys."""


def _listing(keys: list[str], limit: int = 8) -> str:
    more = f' ... and {len(keys) - limit} more' if len(keys) > limit else ''
    return ', '.join(keys[:limit]) + more


def mismatch_lines(missing: list[str], unexpected: list[str], mismatched: list[str]) -> list[str]:
    """Lines naming missing, unexpected and mis-shaped keys (a few of each, and the counts; where the keys are
    many, the modules they are under)."""
    lines, limit = [], 8
    for kind, keys in (('missing keys', missing), ('unexpected keys', unexpected), ('shape mismatches', mismatched)):
        if keys:
            where = f', under {_modules(keys)}' if len(keys) > limit and kind != 'shape mismatches' else ''
            lines.append(f'{kind} ({len(keys)}{where}): {_listing(keys, limit)}')
    return lines


def state_dict_mismatch(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> list[str]:
    """:func:`mismatch_lines` of ``state`` against the model's ``own`` state dict; empty when every key and shape
    matches."""
    return mismatch_lines(sorted(set(own) - set(state)), sorted(set(state) - set(own)),
                          sorted(f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}'
                                 for k in set(own) & set(state) if state[k].shape != own[k].shape))


def load_strict(model: nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    """Load ``state`` into ``model``; any missing, unexpected or mis-shaped key is a
    :class:`CheckpointMismatchError` listing them."""
    problems = state_dict_mismatch(model.state_dict(), state)
    if problems:
        raise CheckpointMismatchError('\n'.join([f'{path!r} does not match {type(model).__name__} (is it a checkpoint '
                                                 'of this architecture and size?).', *problems]))
    model.load_state_dict(state, strict=True)


def load_pretrained(model: nn.Module, path: str, prefix: str | None = None,
                    map_location: str | torch.device = 'cpu') -> None:
    """Read ``path`` (see :func:`read_state_dict`), map it with the model's ``checkpoint_filter_fn`` when it has
    one, and load it strictly."""
    hint = f"{getattr(model, 'WEIGHTS_HINT', '')} To train from scratch instead, set the backbone's init_cfg=None."
    state = read_state_dict(path, prefix, hint.strip(), map_location)
    filter_fn = getattr(model, 'checkpoint_filter_fn', None)
    if filter_fn is not None:
        state = filter_fn(state)
    load_strict(model, state, path)
    print_log(f'loaded {len(state)} tensors into {type(model).__name__} from {path}', logger='current')


@WEIGHT_INITIALIZERS.register_module()
class StrictPretrained:
    """Initializer loading a checkpoint strictly (:func:`load_pretrained`), where mmengine's ``Pretrained`` skips
    what does not match. mmwf's backbones load ``dict(type='Pretrained', ...)`` with this one
    (:func:`init_weights_pretrained_last`).

    Args:
        checkpoint (str): a local ``.pth`` (read weights-only) or ``.safetensors`` file, a URL, or a
            ``torchvision://`` / ``open-mmlab://`` / ``mmcls://`` name.
        prefix (str, optional): keep only the keys under this prefix, with or without its dot (e.g.
            ``'backbone'``). Defaults to None: the whole checkpoint, or the backbone of a whole-model checkpoint.
        map_location (str): where the tensors are loaded. Defaults to ``'cpu'``.
    """

    def __init__(self, checkpoint: str, prefix: str | None = None, map_location: str = 'cpu') -> None:
        self.checkpoint, self.prefix, self.map_location = checkpoint, prefix, map_location

    def __call__(self, module: nn.Module) -> None:
        load_pretrained(module, self.checkpoint, self.prefix, self.map_location)


# initializers that load weights, applied after every other init_cfg entry (mmengine's rule for ``Pretrained``)
LOADING_INITIALIZERS = ('Pretrained', 'StrictPretrained', 'SoftmaxTransfer')


def init_weights_pretrained_last(module, init_weights: Callable[[], None]) -> None:
    """Run ``init_weights`` (mmengine's ``BaseModule.init_weights`` of ``module``) keeping its contract for
    ``Pretrained``: every other ``init_cfg`` entry first, the loading entries last, in their order; ``Pretrained``
    loads strictly (:class:`StrictPretrained`). ``module.init_cfg`` is left as given."""
    from mmengine.model.weight_init import PretrainedInit
    given = module.init_cfg
    cfgs = [given] if isinstance(given, dict) else list(given or [])

    def loads(cfg: dict) -> bool:
        return cfg.get('type') in LOADING_INITIALIZERS or cfg.get('type') is PretrainedInit

    loading = [c for c in cfgs if loads(c)]
    if module.is_init or not loading:
        return init_weights()
    module.init_cfg = [c for c in cfgs if not loads(c)] or None
    try:
        init_weights()
    finally:
        module.init_cfg = given
    for cfg in loading:
        kind = cfg['type']
        WEIGHT_INITIALIZERS.build(dict(cfg, type='StrictPretrained' if kind in ('Pretrained', PretrainedInit)
                                       else kind))(module)


def student_checkpoint(checkpoint: dict, path: str, backbone_only: bool = False) -> dict:
    """The student of an ``AttentionDistiller`` checkpoint as a checkpoint of its own: ``{'state_dict': the
    student's tensors (or its backbone's), 'meta': {'converted_from', 'dataset_meta' when recorded}}``, which
    loads into the student's config (``load_from``, ``tools/test.py``) or its backbone (``Pretrained``)."""
    state = unwrap_state_dict(checkpoint, path)
    prefix = 'student.backbone.' if backbone_only else 'student.'
    student = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not student:
        raise CheckpointError(f'{path!r} is not a distiller checkpoint: it has no {prefix!r} keys (its keys start '
                              f'with {_modules(list(state))}). Give the checkpoint of an AttentionDistiller run.')
    meta = {'converted_from': path, 'part': 'student.backbone' if backbone_only else 'student'}
    dataset_meta = (checkpoint.get('meta') or {}).get('dataset_meta') if isinstance(checkpoint, dict) else None
    if dataset_meta and not backbone_only:
        meta['dataset_meta'] = dataset_meta
    return {'state_dict': student, 'meta': meta}
