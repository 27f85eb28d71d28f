"""A work folder owned by one training run at a time: two runs started into one folder would overwrite each other's
checkpoints and ``last_checkpoint`` without a word.

The owner holds a kernel lock (``flock``) on ``work_dir/.mmwf_run.lock`` for the whole run. The kernel releases it
when the process ends, however it ends (``kill -9``, a crash, a node reboot), so no pid is guessed: a container
restarted with the pid of its last run, two starters racing, or a lock file left empty are all decided by the kernel.
``.mmwf_run.json`` beside it names the owner (host, pid, start) for the messages. The lock file itself stays: removing
it would let a later run lock a new file while an older one still holds the old.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

LOCK = '.mmwf_run.lock'  # the file the kernel locks
OWNER = '.mmwf_run.json'  # who holds it: host, pid, start

# what flock answers on a file system without such locks (some NFS and Lustre mounts)
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (in this pid namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


def _read_owner(path: str) -> dict:
    """The owner record at ``path``; empty when there is none or it cannot be read (a run killed while writing)."""
    try:
        with open(path) as f:
            owner = json.load(f)
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _describe(owner: dict) -> str:
    return (f'pid {owner.get("pid", "?")} on {owner.get("host", "?")}, started {owner.get("started", "?")}' if owner
            else 'a run that has not written its name yet')


def _refusal(work_dir: str, owner: dict, fix: str) -> RuntimeError:
    return RuntimeError(f'{work_dir} belongs to another training run ({_describe(owner)}): its checkpoints and '
                        'last_checkpoint would be overwritten. Give this run another --work-dir, or wait for that run '
                        f'to end; {fix}')


def _write_owner(path: str, me: dict) -> None:
    """Write the owner record whole (a reader never sees half of it)."""
    partial = f'{path}.{os.getpid()}.tmp'
    with open(partial, 'w') as f:
        json.dump(me, f)
    os.replace(partial, path)


@contextmanager
def owned_work_dir(work_dir: str, rank: int = 0) -> Iterator[list[str]]:
    """Own ``work_dir`` for the block (module docstring). Only ``rank`` 0 of a launch takes it: pass the rank the
    launcher set (:func:`mmwf.engine.world.launched_process`), since the process group does not exist yet. A folder
    another live run holds is refused, naming that run and the fix. Yields the lines to log: a take-over from a run
    that ended without releasing the folder, or the fallback where the file system has no locks."""
    notes: list[str] = []
    if rank != 0:
        yield notes
        return
    os.makedirs(work_dir, exist_ok=True)
    owner_path = os.path.join(work_dir, OWNER)
    me = dict(host=socket.gethostname(), pid=os.getpid(), started=time.strftime('%Y-%m-%d %H:%M:%S'))
    fd = os.open(os.path.join(work_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _refusal(work_dir, _read_owner(owner_path), 'the folder is free as soon as that process has ended '
                       '(its data loader workers too)') from None
    except OSError as err:
        os.close(fd)
        if err.errno not in NO_LOCKS:
            raise
        notes.append(f'{work_dir}: the file system does not lock files ({os.strerror(err.errno)}), so the folder is '
                     'owned by pid instead: a record whose process is gone from this host is taken over')
        with _owned_by_pid(work_dir, me, notes):
            yield notes
        return
    previous = _read_owner(owner_path)
    if previous:
        notes.append(f'{work_dir}: taken over from a run that ended without releasing it ({_describe(previous)}); '
                     'resume it with --resume')
    try:
        _write_owner(owner_path, me)
        yield notes
    finally:
        try:
            os.remove(owner_path)
        except OSError:
            pass
        os.close(fd)  # releases the lock


@contextmanager
def _owned_by_pid(work_dir: str, me: dict, notes: list[str]) -> Iterator[None]:
    """The fallback without kernel locks: the owner record created exclusively; a record of a process gone from this
    host is taken over. It guesses from pids (a restarted container may reuse its old pid), so it is used only where
    ``flock`` is refused."""
    path = os.path.join(work_dir, OWNER)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            owner = _read_owner(path)
            if owner.get('host') == me['host'] and isinstance(owner.get('pid'), int) and \
                    not process_alive(owner['pid']):
                os.remove(path)
                notes.append(f'{work_dir}: taken over from a run that ended without releasing it '
                             f'({_describe(owner)}); resume it with --resume')
                continue
            raise _refusal(work_dir, owner, f'if no run uses the folder (a run on another machine that died), remove '
                           f'{path}') from None
    with os.fdopen(fd, 'w') as f:
        json.dump(me, f)
    try:
        yield
    finally:
        if _read_owner(path).get('pid') == me['pid']:
            os.remove(path)
