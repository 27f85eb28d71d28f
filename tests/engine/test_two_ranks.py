"""The two-process launcher of the multi-process tests repeats a run only when a rank was aborted by C++'s
std::terminate, never when the code under test fails."""
import pytest

from tests.engine.two_ranks import free_port, run_two_ranks
from tests.tool_runner import run_ranks


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
    assert res.returncode != 0 and 'a failure of the code under test' in res.stderr
