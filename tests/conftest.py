import os

import pytest
import torch

# two pytest-xdist workers on two cores: one torch thread each; a single process: every core
torch.set_num_threads(1 if os.environ.get('PYTEST_XDIST_WORKER') else min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
