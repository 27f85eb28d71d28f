import functools
import os

import pytest
import torch
from mmengine.config import Config

from tests.budget import budget_problem, cold_compile_caches, file_limit_s, whole_suite

# two pytest-xdist workers on two cores: one torch thread each, and so for the tools the tests start (they inherit
# OMP_NUM_THREADS); a single process: every core
if os.environ.get('PYTEST_XDIST_WORKER'):
    os.environ['OMP_NUM_THREADS'] = os.environ['MKL_NUM_THREADS'] = '1'
torch.set_num_threads(1 if os.environ.get('PYTEST_XDIST_WORKER') else min(2, os.cpu_count() or 1))
# without a GPU, mmwf's Triton kernels run on the CPU through Triton's interpreter (read when a kernel is defined);
# with one they run compiled, on tensors the tests build on the GPU (tests/triton_device.py: TRITON_DEVICE)
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')

# Test processes only (the tools' processes are untouched): mmengine resolves every `mmdet::` / `mmseg::` /
# `mmpretrain::` base by reading all of that package's metafiles again (about 0.4 s each, most of a config's parse
# time, three quarters of the config tests' time); the result depends only on the installed files, so it is
# remembered for the session. A base that does not resolve raises each time (exceptions are not cached).
Config._get_cfg_path = staticmethod(functools.lru_cache(maxsize=None)(Config._get_cfg_path))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_configure(config: pytest.Config) -> None:
    # xdist hands the groups out largest first by default, which sends the single long tests (each in a group of
    # its own) last: the order of pytest_collection_modifyitems holds instead
    config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Balance the xdist workers (``make test``: ``--dist loadgroup``): the tests of a file share a worker (their
    module fixtures are built once) unless a test names its own ``xdist_group``. Longest first, so that what a
    worker takes last is short: the tests that name a group (the long ones, given a worker of their own), then the
    files with slow tests, then the rest."""
    slow_files = {item.path for item in items if item.get_closest_marker('slow')}
    named = {item.nodeid for item in items if item.get_closest_marker('xdist_group') is not None}
    for item in items:
        if item.nodeid not in named:
            item.add_marker(pytest.mark.xdist_group(str(item.path.relative_to(config.rootpath))))
    items.sort(key=lambda item: (item.nodeid not in named, item.path not in slow_files))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """A worker of ``--dist loadgroup`` reports each test's node id ending in its group (every test has one: see
    :func:`pytest_collection_modifyitems`). A pytest whose node ids ignore pytest-xdist's write spreads each file over
    the workers and builds its module fixtures (a Slurm, a GPU check's dry run) on each, silently: refused."""
    if node.config.getvalue('dist') == 'loadgroup' and ids and '@' not in ids[0].rpartition(']')[2]:
        import xdist
        pytest.exit(f'--dist loadgroup: {ids[0]} has lost its xdist_group: pytest {pytest.__version__} keeps node ids '
                    f'where pytest-xdist {xdist.__version__} does not write the group, so the tests of a file would '
                    'spread over the workers. Install requirements/tests.txt (pytest<9.2), or run without -n.',
                    returncode=pytest.ExitCode.USAGE_ERROR)


_file_seconds: dict[str, float] = {}
_cold_caches: str | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _cold_caches
    if not hasattr(session.config, 'workerinput'):
        _cold_caches = cold_compile_caches()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split('::')[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Where a whole run's time went: the longest files' seconds (setup, call and teardown, summed over both
    workers), each with its limit (docs/testing.md keeps this table for a measured run)."""
    if hasattr(config, 'workerinput') or not _file_seconds:
        return
    total = sum(_file_seconds.values())
    terminalreporter.write_sep('-', f'seconds by file: {total:.0f} s of worker time in all')
    for path, seconds in sorted(_file_seconds.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f'{seconds:7.1f} s  {seconds / total:5.1%}  limit {file_limit_s(path):4.0f} s  '
                                    f'{path}')


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A whole run (``make test``; :func:`tests.budget.whole_suite`) fails when a file took more than its share of
    the budget (:func:`tests.budget.files_over_share`), naming the files."""
    config = session.config
    if hasattr(config, 'workerinput') or not whole_suite(config.args_source == pytest.Config.ArgsSource.TESTPATHS,
                                                         config.option.keyword, config.option.markexpr):
        return
    reporter = config.pluginmanager.get_plugin('terminalreporter')
    if _cold_caches:
        reporter.write_line(f'suite budget: not judged, the compile caches were empty at the start: {_cold_caches}. '
                            'This run filled them; the next judges each file against its share.', yellow=True)
        return
    problem = budget_problem(_file_seconds)
    if problem:
        reporter.write_line(problem, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope='session')
def demo_data(tmp_path_factory):
    """The demo's data as ``tools/generate_demo_data.py`` writes it, once per test process, at 128 x 128 (COCO-style
    detection, ADE20K-style segmentation, ImageNet-style class folders) with the softmax DeiT-T stand-in
    checkpoint. Read-only: a test that changes data copies what it changes."""
    from mmwf.datasets import generate
    from mmwf.demo import write_softmax_stand_in
    out = tmp_path_factory.mktemp('demo_data')
    generate(str(out), size=128, train=8, val=4, seed=1)
    write_softmax_stand_in(str(out / 'checkpoints' / 'deit_t_softmax.pth'), seed=1)
    return out
