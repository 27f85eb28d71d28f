"""Every launcher starts on the CPU: torchrun (one node and two), srun (a real single-node Slurm, and Slurm's
variables for two nodes) and mpirun (real, and its variables). Each process reads the rank its launcher gave it
before the process group exists, joins a gloo group with it, and the group agrees; the tools train and test
through srun and mpirun."""
import json
import os
import sys

import pytest
import torch

from tests.engine.launchers import (
    ROOT,
    mpirun_command,
    mpirun_missing,
    single_node_slurm,
    slurm_missing,
    stand_in_tasks,
)
from tests.engine.two_ranks import TORCHRUN, free_port, run_launch

PROBE = [sys.executable, '-m', 'tests.engine.launcher_run']
SLURM_REASON, MPI_REASON = slurm_missing(), mpirun_missing()


@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
    """A real single-node Slurm for this file's tests (its daemons stop with the module)."""
    if SLURM_REASON:
        pytest.skip(f'no real Slurm here: {SLURM_REASON}')
    with single_node_slurm(tmp_path_factory.mktemp('slurm')) as env:
        yield env


def probe_env(**extra: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT), **extra)
    for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        env.pop(name, None)
    return env


def ranks(out) -> list[dict]:
    return json.loads((out / 'ranks.json').read_text())


def check_ranks(seen: list[dict], local: list[int], node: list[int | None]) -> None:
    """Rank i of the group is the rank the launcher gave process i before the group existed; world size, local rank
    and node as the launcher placed them."""
    world = len(local)
    assert [s['rank'] for s in seen] == list(range(world))
    assert [s['launched'] for s in seen] == [[r, world, loc] for r, loc in zip(range(world), local)]
    assert all(s['world_size'] == world for s in seen)
    assert [s['local_rank'] for s in seen] == local and [s['node'] for s in seen] == node


# the real launchers' starts are slow (their own processes, 10 to 13 s each on 2 cores): `make quick` keeps the
# stand-ins' variables, which test how mmwf reads each launcher, and `make test` runs the launchers themselves
@pytest.mark.slow
def test_torchrun_on_two_nodes(tmp_path):
    """Two torchrun starts on localhost, one process each, as two nodes: ranks 0 and 1, both local rank 0."""
    def cmd(out, port):
        out.mkdir(parents=True, exist_ok=True)
        starts = [f'{" ".join(TORCHRUN[:3])} --nnodes 2 --node_rank {n} --nproc_per_node 1 --master_addr 127.0.0.1 '
                  f'--master_port {port} -m tests.engine.launcher_run {out} pytorch' for n in (0, 1)]
        return ['bash', '-c', f'{starts[0]} & {starts[1]} & wait -n && wait -n']
    res = run_launch(cmd, tmp_path, probe_env(), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    check_ranks(ranks(res.out), local=[0, 0], node=[0, 1])


def test_slurm_variables_of_two_nodes(tmp_path):
    """srun's variables for 2 nodes x 2 tasks, nothing else (no RANK, WORLD_SIZE or MASTER_ADDR), and a stand-in
    scontrol that resolves the node list: rank, local rank and node rank differ as on a cluster."""
    results = stand_in_tasks('slurm', [*PROBE, str(tmp_path), 'slurm'], nodes=2, per_node=2, port=free_port(),
                             folder=tmp_path, env=probe_env())
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    check_ranks(ranks(tmp_path), local=[0, 1, 0, 1], node=[0, 0, 1, 1])


def test_open_mpi_variables(tmp_path):
    """mpirun's variables for 2 processes, with the MASTER_ADDR mpirun -x passes (mmengine needs it too)."""
    results = stand_in_tasks('mpi', [*PROBE, str(tmp_path), 'mpi'], nodes=1, per_node=2, port=free_port(),
                             folder=tmp_path, env=probe_env())
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    check_ranks(ranks(tmp_path), local=[0, 1], node=[None, None])


@pytest.mark.slow
def test_srun_on_a_real_slurm(slurm, tmp_path):
    res = run_launch(lambda out, port: ['srun', '--ntasks=2', '--cpus-per-task=1', '--kill-on-bad-exit=1', *PROBE,
                                        str(out), 'slurm'], tmp_path, probe_env(SLURM_CONF=slurm['SLURM_CONF']),
                     timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    check_ranks(ranks(res.out), local=[0, 1], node=[0, 0])


@pytest.mark.slow
@pytest.mark.skipif(MPI_REASON is not None, reason=f'no mpirun here: {MPI_REASON}')
def test_mpirun(tmp_path):
    res = run_launch(lambda out, port: mpirun_command(2, port, *PROBE, str(out), 'mpi'), tmp_path, probe_env(),
                     timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    check_ranks(ranks(res.out), local=[0, 1], node=[None, None])


def train_options(root) -> list[str]:
    """The segmentation demo for 2 iterations of 2 images a process on the session's demo data."""
    return ['--cfg-options', 'train_cfg.max_iters=2', 'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=2',
            f'train_dataloader.dataset.data_root={root}', f'val_dataloader.dataset.data_root={root}',
            f'test_dataloader.dataset.data_root={root}', 'train_dataloader.batch_size=2']


CONFIG = 'configs/demo/upernet_wf_t_demo.py'


def check_trained_and_tested(work, log: str, tested: str) -> None:
    assert 'Distributed launcher: ' in log or 'world_size: 2' in log
    assert 'rank 0 of 2' in log and (work / 'iter_2.pth').is_file()
    assert torch.load(work / 'iter_2.pth', weights_only=True)['meta']['mmwf_setting']['world_size'] == 2
    assert 'mIoU' in tested


@pytest.mark.slow
def test_tools_through_slurm_train_sh_on_a_real_slurm(slurm, demo_data, tmp_path):
    """tools/slurm_train.sh and tools/slurm_test.sh as a cluster user runs them (2 tasks, one stand-in GPU each):
    both tasks train and save, then both test the checkpoint."""
    root = demo_data / 'ade'
    env = probe_env(SLURM_CONF=slurm['SLURM_CONF'], GPUS='2', GPUS_PER_NODE='2', CPUS_PER_TASK='1',
                    PYTHON=sys.executable)
    res = run_launch(lambda out, port: ['env', f'MASTER_PORT={port}', 'bash', 'tools/slurm_train.sh', 'test', 'mmwf',
                                        CONFIG, str(out), *train_options(root)], tmp_path / 'work', env)
    assert res.returncode == 0, res.stderr[-4000:]
    tested = run_launch(lambda out, port: ['env', f'MASTER_PORT={port}', 'bash', 'tools/slurm_test.sh', 'test',
                                           'mmwf', CONFIG, str(res.out / 'iter_2.pth'), '--work-dir', str(out),
                                           *train_options(root)], tmp_path / 'test', env)
    assert tested.returncode == 0, tested.stderr[-4000:]
    check_trained_and_tested(res.out, res.stdout + res.stderr, tested.stdout + tested.stderr)


@pytest.mark.slow
@pytest.mark.skipif(MPI_REASON is not None, reason=f'no mpirun here: {MPI_REASON}')
def test_tools_through_mpirun(demo_data, tmp_path):
    root = demo_data / 'ade'
    res = run_launch(lambda out, port: mpirun_command(2, port, sys.executable, 'tools/train.py', CONFIG,
                                                      '--work-dir', str(out), '--launcher', 'mpi',
                                                      *train_options(root)), tmp_path / 'work', probe_env())
    assert res.returncode == 0, res.stderr[-4000:]
    tested = run_launch(lambda out, port: mpirun_command(2, port, sys.executable, 'tools/test.py', CONFIG,
                                                         str(res.out / 'iter_2.pth'), '--work-dir', str(out),
                                                         '--launcher', 'mpi', *train_options(root)),
                        tmp_path / 'test', probe_env())
    assert tested.returncode == 0, tested.stderr[-4000:]
    check_trained_and_tested(res.out, res.stdout + res.stderr, tested.stdout + tested.stderr)
