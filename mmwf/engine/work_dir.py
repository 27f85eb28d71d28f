"""A work folder owned by one training run at a time: two runs started into one folder would overwrite each other's
checkpoints and ``last_checkpoint`` without a word."""
from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

LOCK = '.mmwf_run.json'


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


@contextmanager
def owned_work_dir(work_dir: str) -> Iterator[list[str]]:
    """Own ``work_dir`` for the block: rank 0 (``RANK``, 0 without a launcher) creates ``work_dir/.mmwf_run.json``
    (host, pid, start) exclusively and removes it at the end. A folder another live run owns is refused, naming that
    run and the fix; a lock left by a run that ended on this machine (killed, crashed) is taken over. Yields the lines
    to log (the take-over)."""
    notes: list[str] = []
    if int(os.environ.get('RANK', 0)) != 0:
        yield notes
        return
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, LOCK)
    me = dict(host=socket.gethostname(), pid=os.getpid(), started=time.strftime('%Y-%m-%d %H:%M:%S'))
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            try:
                with open(path) as f:
                    owner = json.load(f)
            except (OSError, ValueError):
                owner = {}
            if owner.get('host') == me['host'] and isinstance(owner.get('pid'), int) and \
                    not process_alive(owner['pid']):
                os.remove(path)
                notes.append(f'{work_dir}: taken over from a run that ended without releasing it (pid {owner["pid"]}, '
                             f'started {owner.get("started", "?")}); resume it with --resume')
                continue
            who = (f'pid {owner["pid"]} on {owner["host"]}, started {owner.get("started", "?")}' if owner
                   else 'a run whose lock is unreadable')
            raise RuntimeError(f'{work_dir} belongs to another training run ({who}): its checkpoints and '
                               'last_checkpoint would be overwritten. Give this run another --work-dir, or wait for '
                               f'that run to end; if no run uses the folder (a run on another machine that died), '
                               f'remove {path}') from None
    with os.fdopen(fd, 'w') as f:
        json.dump(me, f)
    try:
        yield notes
    finally:
        try:
            with open(path) as f:
                if json.load(f).get('pid') == me['pid']:
                    os.remove(path)
        except (OSError, ValueError):
            pass
