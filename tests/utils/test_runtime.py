"""The tools' distributed start (``init_tool_distributed``): each process takes the GPU of its local rank before
the process group starts, as mmengine's ``init_dist`` does."""
import json
import os

import pytest
import torch
import torch.distributed as dist

from mmwf.utils import init_tool_distributed
from tests.engine.two_ranks import run_two_ranks


def test_each_process_takes_its_gpu_before_joining_nccl(monkeypatch):
    """NCCL puts a rank on the current device: the device is set first (recorded with stand-ins for torch's calls;
    the order is the fault a first multi-GPU run hit, every rank on GPU 0). The local rank is the launcher's:
    torchrun's LOCAL_RANK, srun's SLURM_LOCALID, mpirun's OMPI_COMM_WORLD_LOCAL_RANK."""
    calls = []
    names = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'SLURM_PROCID', 'SLURM_NTASKS',
             'SLURM_LOCALID', 'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_LOCAL_RANK')
    for name in names:  # recorded, so that what the code under test exports is undone
        monkeypatch.setenv(name, '')
        monkeypatch.delenv(name)
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: calls.append(('set_device', device)))
    monkeypatch.setattr(dist, 'init_process_group', lambda backend: calls.append(('init_process_group', backend)))
    monkeypatch.setattr(dist, 'get_rank', lambda: int(os.environ['RANK']))
    monkeypatch.setattr(dist, 'get_world_size', lambda: int(os.environ['WORLD_SIZE']))
    for launcher, variables in (('pytorch', dict(RANK='3', WORLD_SIZE='4', LOCAL_RANK='3')),
                                ('slurm', dict(SLURM_PROCID='3', SLURM_NTASKS='4', SLURM_LOCALID='3',
                                               MASTER_ADDR='head')),
                                ('mpi', dict(OMPI_COMM_WORLD_RANK='3', OMPI_COMM_WORLD_SIZE='4',
                                             OMPI_COMM_WORLD_LOCAL_RANK='3', MASTER_ADDR='head'))):
        calls.clear()
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        assert init_tool_distributed(launcher, 'cuda') == (3, 4, 'cuda:3'), launcher
        assert calls == [('set_device', 'cuda:3'), ('init_process_group', 'nccl')], launcher
        for name in names:
            monkeypatch.delenv(name, raising=False)
    assert init_tool_distributed('none', 'cuda') == (0, 1, 'cuda')


@pytest.mark.slow
def test_two_gloo_processes_take_their_local_ranks_device(tmp_path):
    res = run_two_ranks('tests.utils.launched_device_run', tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    seen = [json.loads((res.out / f'rank{r}.json').read_text()) for r in (0, 1)]
    for rank, s in enumerate(seen):
        assert s == dict(rank=rank, world_size=2, device='cpu', backend='gloo', gpu=f'cuda:{rank}', local_rank=rank)
