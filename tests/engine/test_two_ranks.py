"""The two-process launcher of the multi-process tests repeats a run only when a rank was aborted by C++'s
std::terminate, never when the code under test fails."""
import json

import pytest

from tests.engine.two_ranks import free_port, run_two_ranks
from tests.tool_runner import fork_server, run_ranks


@pytest.mark.slow
def test_an_aborted_launch_is_repeated_once_in_a_fresh_folder(tmp_path):
    res = run_two_ranks('tests.engine.abort_run', tmp_path, 'abort')
    assert res.returncode == 0 and res.out == tmp_path / 'again'
    assert sorted(p.name for p in res.out.glob('rank*.txt')) == ['rank0.txt', 'rank1.txt']


@pytest.mark.slow
def test_a_python_failure_is_returned_as_it_is(tmp_path):
    res = run_two_ranks('tests.engine.abort_run', tmp_path, 'raise')
    assert res.returncode != 0 and res.out == tmp_path and 'a failure of the code under test' in res.stderr
    assert not (tmp_path / 'again').exists()


@pytest.mark.slow
def test_a_failed_rank_ends_the_other_as_torchrun_does(tmp_path):
    """Rank 1 fails while rank 0 waits for it at a barrier (gloo's default timeout: 30 minutes): the launch ends
    with rank 1's failure well inside its time limit, which would otherwise stop it."""
    res = run_ranks(['-m', 'tests.engine.abort_run', str(tmp_path), 'raise-while-0-waits'], free_port(), timeout=120)
    assert res.returncode == 1 and 'a failure of the code under test' in res.stderr  # rank 1's status, not the kill's


def test_the_ranks_are_forked_with_the_variables_of_an_env_launch(tmp_path):
    """Each rank a child of a fork server of its own (mmwf imported already), with RANK and the rest set."""
    code = ('import json, os, sys; print(json.dumps([os.getppid(), "mmwf" in sys.modules, *(os.environ[k] for k in '
            '("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))]))')
    res = run_ranks(['-c', code], '29400', cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    seen = [json.loads(line) for line in res.stdout.splitlines()]
    assert [s[1:] for s in seen] == [[True, str(r), str(r), '2', '2', '127.0.0.1', '29400'] for r in (0, 1)]
    assert [s[0] for s in seen] == [fork_server(r).proc.pid for r in (0, 1)]
