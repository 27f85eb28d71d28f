"""Writing checkpoints: atomically (never a partial file where a complete one was) and as plain data that
``torch.load(weights_only=True)`` reads with torch's default allow-list.

An mmengine training checkpoint holds ``HistoryBuffer`` objects (its message hub's logged scalars) and numpy values;
pickled as they are, loading them weights-only needs ``builtins.getattr`` (a crafted file could call anything with
it). :func:`plain_checkpoint` turns them into lists and Python numbers before the save; :func:`restore_checkpoint`
turns the buffers back on load.
"""
from __future__ import annotations

import glob
import os
import re
import socket
import stat
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable

import numpy as np
import torch
from mmengine.fileio.backends import LocalBackend
from mmengine.logging import HistoryBuffer

CHECKPOINT_SUFFIXES = ('.pth', '.pt', '.ckpt', '.safetensors')
BUFFER_KEY = 'mmwf_history_buffer'  # marks a HistoryBuffer written as plain data
_HOST = re.sub(r'[^A-Za-z0-9-]', '-', socket.gethostname())[:32]
# what atomic_write writes first: .NAME.HOST.PID.XXXXXXXX.tmp
TEMPORARY = re.compile(r'^\.(?P<name>.+)\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$')


def _writer_is_gone(name: str) -> bool:
    """A temporary file of :func:`atomic_write` whose writer, a process of this machine, has ended."""
    found = TEMPORARY.match(name)
    if not found or found.group('host') != _HOST:
        return False
    try:
        os.kill(int(found.group('pid')), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a live process of another user
        return False
    return False


def remove_stale_temporaries(folder: str) -> list[str]:
    """Remove the temporary files a killed :func:`atomic_write` of this machine left in ``folder`` (their writer
    process has ended; files of live writers and of other machines are kept). Returns the removed paths."""
    removed = []
    for path in glob.glob(os.path.join(glob.escape(folder), '.*.tmp')):
        if _writer_is_gone(os.path.basename(path)):
            try:
                os.remove(path)
                removed.append(path)
            except FileNotFoundError:
                pass
    return removed


def output_problem(path: str) -> str | None:
    """What keeps a file from being written at ``path`` (checked before a tool's work, not after it), or None: the
    path is a folder, or its folder cannot be created or written."""
    if os.path.isdir(path):
        return f'{path} is a folder; give a file name'
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f'cannot create the folder {folder}: {existing} is a file'
    if not os.access(existing, os.W_OK | os.X_OK):
        return f'cannot write in {existing}'
    return None


def atomic_write(path: str, write: Callable, mode: str = 'wb') -> None:
    """Write a file so that it is either the old or the complete new one, never a part: ``write(f)`` fills a
    temporary file ``.NAME.HOST.PID.XXXXXXXX.tmp`` in the same folder, which is flushed, fsynced and renamed over
    ``path`` (keeping an existing file's permission bits; then the folder is fsynced). What killed writers left
    in the folder is removed first (:func:`remove_stale_temporaries`). A path that exists but is not a regular file
    (a device, a link), or a folder where no file can be created, is written in place."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    remove_stale_temporaries(folder)
    tmp = os.path.join(folder, f'.{os.path.basename(path)}.{_HOST}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp')
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


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend writing checkpoints atomically (:func:`atomic_write`); other files (logs,
    results, pictures) are written as mmengine writes them. mmwf's configs select it for their checkpoints by name
    (``default_hooks.checkpoint.backend_args=dict(backend=ATOMIC_BACKEND)``); mmengine's own ``local`` backend
    opens the target and writes into it, so a run killed while saving leaves a truncated file there."""

    def put(self, obj: bytes, filepath: str) -> None:
        if str(filepath).endswith(CHECKPOINT_SUFFIXES):
            atomic_write(str(filepath), lambda f: f.write(obj))
        else:
            super().put(obj, filepath)


ATOMIC_BACKEND = 'mmwf_atomic_local'


def register_atomic_backend() -> None:
    """Make :class:`AtomicLocalBackend` known to mmengine as ``ATOMIC_BACKEND`` (a new name; mmengine's own
    backends are left as they are). Idempotent; called when a run of an mmwf config starts."""
    from mmengine.fileio.backends import backends, register_backend
    if ATOMIC_BACKEND not in backends:
        register_backend(ATOMIC_BACKEND, AtomicLocalBackend)


def _plain(value: object) -> object:
    """``value`` with numpy scalars as Python numbers, numpy arrays as lists and ``HistoryBuffer`` objects as
    ``{BUFFER_KEY: {...}}`` dicts, inside dicts, lists and tuples."""
    if isinstance(value, HistoryBuffer):
        log, count = value.data
        return {BUFFER_KEY: dict(log=log.tolist(), count=count.tolist(), max_length=value.max_length)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):  # the dict types torch's weights-only loading rebuilds are kept
        kind = type(value) if type(value) in (OrderedDict, Counter) else dict
        return kind((k, _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, '_fields'):
        return type(value)(_plain(v) for v in value)
    return value


def plain_checkpoint(checkpoint: dict) -> None:
    """Make an mmengine checkpoint dict plain data in place (every entry but the tensors of ``state_dict``):
    ``torch.load(weights_only=True)`` then reads it with torch's default allow-list."""
    for key, value in checkpoint.items():
        if key != 'state_dict':
            checkpoint[key] = _plain(value)


def _restored(value: object) -> object:
    if isinstance(value, dict) and set(value) == {BUFFER_KEY}:
        data = value[BUFFER_KEY]
        return HistoryBuffer(data['log'], data['count'], data['max_length'])
    if isinstance(value, dict):
        return type(value)((k, _restored(v)) for k, v in value.items())
    return value


def restore_checkpoint(checkpoint: dict) -> None:
    """Turn the message hub's plain buffers of a checkpoint written by :func:`plain_checkpoint` back into
    ``HistoryBuffer`` objects, in place, so that mmengine resumes them."""
    hub = checkpoint.get('message_hub')
    if isinstance(hub, dict) and isinstance(hub.get('log_scalars'), dict):
        hub['log_scalars'] = _restored(hub['log_scalars'])
