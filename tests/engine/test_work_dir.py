"""A work folder owned by one training run: a second run into it is refused before any work, and the kernel's lock
decides, not a pid: a run killed with SIGKILL, a new pid namespace whose pid equals the old owner's, two starters
racing and an empty lock file are each decided right. Without file locks, the pid rule, said in the log."""
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mmwf.engine import work_dir as work_dir_module
from mmwf.engine.work_dir import LOCK, OWNER, owned_work_dir
from tests.tool_runner import run_tool

ROOT = Path(__file__).resolve().parents[2]
# the other processes load mmwf/engine/work_dir.py alone (it imports only the standard library), not mmwf: an
# import of mmwf costs a process 3 to 4 s of torch on 2 cores, and the race starts four
LOAD = ('import importlib.util, sys\n'
        f'spec = importlib.util.spec_from_file_location("work_dir", {work_dir_module.__file__!r})\n'
        'work_dir = sys.modules["work_dir"] = importlib.util.module_from_spec(spec)\n'
        'spec.loader.exec_module(work_dir)\nowned_work_dir = work_dir.owned_work_dir\n')
HOLD = (LOAD + 'import time\n'
        'with owned_work_dir(sys.argv[1]) as notes:\n    print("held", notes, flush=True)\n    time.sleep(600)\n')


def holder(folder: Path, *prefix: str) -> subprocess.Popen:
    """A process that owns ``folder`` until it is killed; returns once it holds it."""
    proc = subprocess.Popen([*prefix, sys.executable, '-c', HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.readline().startswith('held'), 'the holder did not take the folder'
    return proc


def test_a_folder_is_owned_for_the_run_and_released(tmp_path):
    with owned_work_dir(str(tmp_path)) as notes:
        owner = json.loads((tmp_path / OWNER).read_text())
        assert notes == [] and owner['pid'] == os.getpid()
        with pytest.raises(RuntimeError, match=rf'{re.escape(str(tmp_path))} belongs to another training run '
                                               rf'\(pid {owner["pid"]} on .*\): its checkpoints .* another --work-dir'):
            with owned_work_dir(str(tmp_path)):
                pass
        assert json.loads((tmp_path / OWNER).read_text()) == owner  # the refused start left the owner alone
    assert not (tmp_path / OWNER).exists() and (tmp_path / LOCK).exists()  # the lock file stays, unlocked
    with owned_work_dir(str(tmp_path)) as notes:
        assert notes == []


def test_only_rank_zero_owns_the_folder(tmp_path):
    with owned_work_dir(str(tmp_path), rank=1) as notes:
        assert notes == [] and not (tmp_path / LOCK).exists()


def test_a_run_killed_with_sigkill_releases_the_folder(tmp_path):
    proc = holder(tmp_path)
    with pytest.raises(RuntimeError, match=f'pid {proc.pid} on'):
        with owned_work_dir(str(tmp_path)):
            pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with owned_work_dir(str(tmp_path)) as notes:
        assert len(notes) == 1 and notes[0].startswith(
            f'{tmp_path}: taken over from a run that ended without releasing it (pid {proc.pid} on '
            f'{socket.gethostname()}, started ') and notes[0].endswith('); resume it with --resume')


def test_a_record_naming_a_live_pid_does_not_hold_the_folder(tmp_path):
    """A container restarted on the same host may get the pid its last run had (pid 1 in its namespace): the record
    then names a live process, this one. Only the kernel's lock counts."""
    (tmp_path / OWNER).write_text(json.dumps(dict(host=socket.gethostname(), pid=os.getpid(), started='earlier')))
    with owned_work_dir(str(tmp_path)) as notes:
        assert notes == [f'{tmp_path}: taken over from a run that ended without releasing it (pid {os.getpid()} on '
                         f'{socket.gethostname()}, started earlier); resume it with --resume']


UNSHARE = ['unshare', '--pid', '--fork', '--mount-proc', '--kill-child=SIGKILL']


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which('unshare') is None,
                    reason='a new pid namespace needs root and unshare')
def test_a_new_pid_namespace_with_the_old_owners_pid_takes_the_folder(tmp_path):
    """A run as pid 1 of its namespace is killed; the next, pid 1 of a new one, takes the folder over."""
    proc = holder(tmp_path, *UNSHARE)
    assert json.loads((tmp_path / OWNER).read_text())['pid'] == 1
    proc.send_signal(signal.SIGKILL)  # unshare; the kernel kills its child, pid 1 of the namespace
    proc.wait()
    again = subprocess.run([*UNSHARE, sys.executable, '-c', HOLD.replace('time.sleep(600)', 'pass'), str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                           timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert 'taken over from a run that ended without releasing it (pid 1 on' in again.stdout


RACE = (LOAD + 'import time\nfrom pathlib import Path\n'
        'print("ready", flush=True)\nwhile not Path(sys.argv[2]).exists():\n    time.sleep(0.001)\n'
        'try:\n    with owned_work_dir(sys.argv[1]):\n        print("owned", flush=True)\n'
        '        while not Path(sys.argv[3]).exists():\n            time.sleep(0.01)\n'
        'except RuntimeError:\n    print("refused", flush=True)\n')


def test_starters_racing_for_a_stale_folder_leave_one_owner(tmp_path):
    """Four starters released at once into a folder a dead run left (its record, an empty lock file): one owns it
    (and holds it until all have answered), three are refused."""
    work, go, done = tmp_path / 'work', tmp_path / 'go', tmp_path / 'done'
    work.mkdir()
    (work / LOCK).write_text('')
    (work / OWNER).write_text(json.dumps(dict(host=socket.gethostname(), pid=999_999_999, started='earlier')))
    procs = [subprocess.Popen([sys.executable, '-c', RACE, str(work), str(go), str(done)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
             for _ in range(4)]
    assert [p.stdout.readline().strip() for p in procs] == ['ready'] * 4
    go.touch()
    answers = sorted(p.stdout.readline().strip() for p in procs)
    done.touch()
    for p in procs:
        p.communicate(timeout=60)
    assert answers == ['owned', 'refused', 'refused', 'refused']


def test_empty_files_left_by_a_killed_start_hold_nothing(tmp_path):
    (tmp_path / LOCK).write_text('')
    (tmp_path / OWNER).write_text('')
    with owned_work_dir(str(tmp_path)) as notes:
        assert notes == []  # an unreadable record names no run to take over from
        assert json.loads((tmp_path / OWNER).read_text())['pid'] == os.getpid()


def test_without_file_locks_the_pid_rule_is_used_and_said(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    monkeypatch.setattr(work_dir_module.fcntl, 'flock', no_locks)
    with owned_work_dir(str(tmp_path)) as notes:
        assert notes == [f'{tmp_path}: the file system does not lock files ({os.strerror(errno.ENOLCK)}), so the '
                         'folder is owned by pid instead: a record whose process is gone from this host is taken over']
        with pytest.raises(RuntimeError, match=f'pid {os.getpid()} on .* remove {re.escape(str(tmp_path / OWNER))}'):
            with owned_work_dir(str(tmp_path)):
                pass
    assert not (tmp_path / OWNER).exists()


def test_train_refuses_a_folder_another_run_owns_before_any_work(tmp_path):
    """tools/train.py into a folder this test process owns: refused, and nothing of a run is written there."""
    with owned_work_dir(str(tmp_path)):
        res = run_tool('tools/train.py', ROOT / 'configs/demo/weightformer_t_cls_demo.py', '--work-dir', tmp_path,
                       ok=False)
        assert 'belongs to another training run' in res.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LOCK, OWNER])
