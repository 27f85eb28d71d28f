"""The suite's time budget (docs/testing.md): `make test`'s pytest in :data:`SUITE_BUDGET_S` on 2 cores (two xdist
workers), and no test file (its tests' setup, call and teardown, summed) past :data:`FILE_SHARE` of the workers'
time in it, so that one growing file shows before the suite is over its budget."""
from __future__ import annotations

import os

SUITE_BUDGET_S, WORKERS, FILE_SHARE = 480, 2, 0.10
# a file's time differs between runs and machines: by up to 23 % between two quiet runs on one machine, and by a
# median 1.5x (1.3x to 1.7x) for the files no change touched between the AMD machine of 2f3f9e0 and the AMD machine of
# 8cebc54 (docs/testing.md): a file is judged past its limit times this
MACHINE_SPREAD = 2.0
# The files already past their share, each with the most seconds it took in two measured runs on the faster machine
# (docs/testing.md: 068fb87 and 2f3f9e0): debts to cut, held where they are. A listed file fails past its own seconds
# times the spread; taking one off pays it back.
OVER_SHARE_S = {'tests/tools/test_train_tools.py': 147, 'tests/engine/test_launchers.py': 116}


def file_limit_s(path: str = '') -> float:
    """The seconds the tests of file ``path`` may take: their share of the workers' time in the budget, or the
    file's own measured seconds where it is already past it (:data:`OVER_SHARE_S`); times the machines' spread."""
    return OVER_SHARE_S.get(path, FILE_SHARE * SUITE_BUDGET_S * WORKERS) * MACHINE_SPREAD


def whole_suite(default_paths: bool, keyword: str, markexpr: str) -> bool:
    """Whether a run is the suite as `make test` runs it: the configured test paths, no keyword selection, every
    marker but the benchmarks."""
    return default_paths and not keyword and markexpr == 'not benchmark'


def budget_problem(seconds: dict[str, float]) -> str | None:
    """What is wrong with a whole run whose files took ``seconds`` (path -> seconds), or None: the files past
    :func:`file_limit_s`, longest first, each with its limit, and the fix."""
    over = sorted(((s, path) for path, s in seconds.items() if s > file_limit_s(path)), reverse=True)
    if not over:
        return None
    files = ', '.join(f'{path} {s:.0f} s (limit {file_limit_s(path):.0f} s)' for s, path in over)
    return (f'suite budget: {files}. A file may take {FILE_SHARE:.0%} of {SUITE_BUDGET_S} s x {WORKERS} workers, '
            f'x {MACHINE_SPREAD} for the machines\' spread. Split the file, or share what its tests start (one '
            'process, one gloo group, fixtures built once per worker): docs/testing.md')


def cold_compile_caches() -> str | None:
    """Which compile caches are empty, read at a run's start, or None: inductor's and Triton's. A run that fills
    them pays minutes the budget does not count (docs/testing.md: a cold `make test` has its own), so its files are
    not judged against their shares."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    from triton.runtime.cache import knobs
    inductor = os.path.abspath(os.environ.get('TORCHINDUCTOR_CACHE_DIR') or default_cache_dir())  # as inductor reads it
    empty = [f'{name} ({path})' for name, path in (('inductor', os.path.join(inductor, 'fxgraph')),
                                                   ('Triton', knobs.cache.dir))
             if not os.path.isdir(path) or not any(os.scandir(path))]
    return ', '.join(empty) or None
