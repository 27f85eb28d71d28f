"""The suite's budget check (tests/budget.py): which runs it judges, and the files it names."""
from tests.budget import FILE_SHARE, MACHINE_SPREAD, OVER_SHARE_S, SUITE_BUDGET_S, WORKERS, budget_problem, whole_suite


def test_only_the_whole_suite_is_judged():
    assert whole_suite(True, '', 'not benchmark')
    assert not whole_suite(False, '', 'not benchmark')  # files named on the command line
    assert not whole_suite(True, 'compile', 'not benchmark')
    assert not whole_suite(True, '', 'not slow and not benchmark')  # make quick


def test_files_past_their_share_are_named_longest_first():
    limit = FILE_SHARE * SUITE_BUDGET_S * WORKERS * MACHINE_SPREAD  # 192 s
    assert limit == 192
    assert budget_problem({'tests/a.py': limit, 'tests/b.py': 1.0}) is None  # at the limit is within it
    problem = budget_problem({'tests/a.py': limit + 1, 'tests/b.py': 2 * limit, 'tests/c.py': 1.0})
    assert problem.startswith('suite budget: tests/b.py 384 s (limit 192 s), tests/a.py 193 s (limit 192 s). A file')
    assert 'tests/c.py' not in problem


def test_a_file_already_past_its_share_is_held_at_its_measured_time():
    path, measured = 'tests/tools/test_train_tools.py', OVER_SHARE_S['tests/tools/test_train_tools.py']
    assert budget_problem({path: measured * MACHINE_SPREAD}) is None
    assert budget_problem({path: measured * MACHINE_SPREAD + 1}).startswith(f'suite budget: {path} ')


def test_a_run_that_starts_with_an_empty_compile_cache_is_named_cold(tmp_path, monkeypatch):
    """Inductor's FX graph cache and Triton's cache, each read where the run reads it."""
    from tests.budget import cold_compile_caches
    (tmp_path / 'inductor' / 'fxgraph').mkdir(parents=True)
    (tmp_path / 'triton').mkdir()
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', str(tmp_path / 'inductor'))
    monkeypatch.setenv('TRITON_CACHE_DIR', str(tmp_path / 'triton'))
    assert cold_compile_caches() == f'inductor ({tmp_path}/inductor/fxgraph), Triton ({tmp_path}/triton)'
    (tmp_path / 'inductor' / 'fxgraph' / 'entry').write_text('')
    (tmp_path / 'triton' / 'entry').write_text('')
    assert cold_compile_caches() is None
