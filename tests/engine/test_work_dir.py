"""A work folder owned by one training run: a second run into it is refused before any work, a lock left by a run
that died is taken over, and the lock goes with the run."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mmwf.engine.work_dir import LOCK, owned_work_dir
from tests.tool_runner import run_tool

ROOT = Path(__file__).resolve().parents[2]


def ended_pid() -> int:
    """The pid of a process that has ended (a run killed or crashed)."""
    proc = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
    return int(proc.stdout)


def test_a_folder_is_owned_for_the_run_and_released(tmp_path):
    with owned_work_dir(str(tmp_path)) as notes:
        owner = json.loads((tmp_path / LOCK).read_text())
        assert notes == [] and owner['pid'] > 0
        with pytest.raises(RuntimeError, match=rf'{re.escape(str(tmp_path))} belongs to another training run '
                                               rf'\(pid {owner["pid"]} on .*\): its checkpoints .* another --work-dir'):
            with owned_work_dir(str(tmp_path)):
                pass
        assert (tmp_path / LOCK).exists()  # the refused run left the owner's lock alone
    assert not (tmp_path / LOCK).exists()


def test_a_lock_of_a_run_that_ended_is_taken_over(tmp_path):
    import socket
    pid = ended_pid()
    (tmp_path / LOCK).write_text(json.dumps(dict(host=socket.gethostname(), pid=pid, started='earlier')))
    with owned_work_dir(str(tmp_path)) as notes:
        assert notes == [f'{tmp_path}: taken over from a run that ended without releasing it (pid {pid}, started '
                         'earlier); resume it with --resume']
    assert not (tmp_path / LOCK).exists()


def test_train_refuses_a_folder_another_run_owns_before_any_work(tmp_path):
    """tools/train.py into a folder this test process owns: refused, and nothing of a run is written there."""
    with owned_work_dir(str(tmp_path)):
        res = run_tool('tools/train.py', ROOT / 'configs/demo/weightformer_t_cls_demo.py', '--work-dir', tmp_path,
                       ok=False)
        assert 'belongs to another training run' in res.stderr
        assert [p.name for p in tmp_path.iterdir()] == [LOCK]
