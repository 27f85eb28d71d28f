"""The two-process launcher of the multi-process tests repeats a run only when a rank was aborted by C++'s
std::terminate, never when the code under test fails."""
import pytest

from tests.engine.two_ranks import run_two_ranks


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
