import os

import pytest
import torch

# two pytest-xdist workers on two cores: one torch thread each; a single process: every core
torch.set_num_threads(1 if os.environ.get('PYTEST_XDIST_WORKER') else min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Balance the xdist workers (``make test``: ``--dist loadgroup``): the tests of a file share a worker (their
    module fixtures are built once) unless a test names its own ``xdist_group``; files with slow tests are handed out
    first, so that what a worker takes last is short."""
    slow_files = {item.path for item in items if item.get_closest_marker('slow')}
    for item in items:
        if item.get_closest_marker('xdist_group') is None:
            item.add_marker(pytest.mark.xdist_group(str(item.path.relative_to(config.rootpath))))
    items.sort(key=lambda item: item.path not in slow_files)
