"""The cluster launchers for the tests, on this machine: a real single-node Slurm (Debian's slurm-wlm and munge, as
root), Open MPI's mpirun, and, where neither can start, stand-ins that set the variables srun and mpirun set (and a
stand-in ``scontrol``), so that rank, local rank and node rank differ as on a cluster."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SLURM_BINARIES = ('slurmctld', 'slurmd', 'srun', 'scontrol', 'sinfo', 'munged', 'munge', 'unmunge')


def slurm_missing() -> str | None:
    """Why a real Slurm cannot start here (None: it can)."""
    if os.geteuid() != 0:
        return 'a single-node Slurm starts its daemons as root'
    absent = [b for b in SLURM_BINARIES if shutil.which(b) is None and not Path('/usr/sbin', b).exists()]
    return f'{", ".join(absent)} not installed (tools/install.sh installs them as root)' if absent else None


def _wait(check, what: str, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while not check():
        if time.time() > deadline:
            raise RuntimeError(f'{what} did not come up in {seconds} s')
        time.sleep(0.1)


def _ok(*cmd: str, env: dict | None = None) -> bool:
    return subprocess.run(cmd, capture_output=True, env=env).returncode == 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


@contextmanager
def single_node_slurm(folder: Path, gpus: int = 2) -> Iterator[dict]:
    """A Slurm controller and one node daemon on this machine, with their own configuration, state and ports in
    ``folder``, the node declaring ``gpus`` stand-in GPUs (character devices that are no GPU: Slurm drops a GPU
    without a device file), so that
    ``srun --gres=gpu:N`` is accepted as on a GPU cluster; yields the environment for ``srun`` (``SLURM_CONF``).
    munge is started if it is not running."""
    folder.mkdir(parents=True, exist_ok=True)
    node = subprocess.run(['slurmd', '-C'], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    host = node.split()[0].partition('=')[2]
    devices = ['/dev/null', '/dev/zero', '/dev/full', '/dev/urandom'][:gpus]
    (folder / 'gres.conf').write_text(''.join(f'Name=gpu File={d}\n' for d in devices))
    node += f' Gres=gpu:{gpus}'
    conf = folder / 'slurm.conf'
    conf.write_text('\n'.join([
        'ClusterName=mmwftest', f'SlurmctldHost={host}', 'SlurmUser=root', 'AuthType=auth/munge',
        'ProctrackType=proctrack/linuxproc', 'TaskPlugin=task/none', 'MpiDefault=none', 'ReturnToService=2',
        f'StateSaveLocation={folder}/state', f'SlurmdSpoolDir={folder}/spool',
        f'SlurmctldPidFile={folder}/slurmctld.pid', f'SlurmdPidFile={folder}/slurmd.pid',
        f'SlurmctldLogFile={folder}/slurmctld.log', f'SlurmdLogFile={folder}/slurmd.log',
        f'SlurmctldPort={_free_port()}', f'SlurmdPort={_free_port()}',
        'GresTypes=gpu', 'SelectType=select/cons_tres', 'SelectTypeParameters=CR_Core',  # linear ignores GPUs
        'AccountingStorageType=accounting_storage/none', 'JobAcctGatherType=jobacct_gather/none',
        node, 'PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP', '']))
    (folder / 'state').mkdir(exist_ok=True)
    (folder / 'spool').mkdir(exist_ok=True)
    env = dict(os.environ, SLURM_CONF=str(conf))
    if not _ok('sh', '-c', 'munge -n | unmunge'):
        Path('/run/munge').mkdir(parents=True, exist_ok=True)
        shutil.chown('/run/munge', 'munge', 'munge')
        subprocess.run(['runuser', '-u', 'munge', '--', '/usr/sbin/munged'], check=True)
        _wait(lambda: _ok('sh', '-c', 'munge -n | unmunge'), 'munged')
    try:
        subprocess.run(['slurmctld', '-f', str(conf)], check=True, env=env)
        _wait(lambda: b'UP' in subprocess.run(['scontrol', 'ping'], capture_output=True, env=env).stdout, 'slurmctld')
        subprocess.run(['slurmd', '-f', str(conf)], check=True, env=env)
        _wait(lambda: b'idle' in subprocess.run(['sinfo', '-h', '-o', '%T'], capture_output=True, env=env).stdout,
              'slurmd')
        yield env
    finally:
        for daemon in ('slurmd', 'slurmctld'):
            pid_file = folder / f'{daemon}.pid'
            if pid_file.is_file():
                try:
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    pass


def mpirun_missing() -> str | None:
    """Why Open MPI's mpirun cannot start processes here (None: it can)."""
    if shutil.which('mpirun') is None:
        return 'mpirun (Open MPI) is not installed (tools/install.sh installs it as root)'
    return None


def mpirun_command(processes: int, port: str, *cmd: str) -> list[str]:
    """``mpirun`` starting ``cmd`` ``processes`` times on this machine, meeting at 127.0.0.1:``port``."""
    return ['mpirun', '--allow-run-as-root', '--oversubscribe', '-n', str(processes), '-x', 'MASTER_ADDR=127.0.0.1',
            '-x', f'MASTER_PORT={port}', '-x', 'OMP_NUM_THREADS=1', '-x', 'PYTHONPATH', *cmd]


def stand_in_scontrol(folder: Path) -> str:
    """A folder holding an ``scontrol`` that answers ``show hostname(s) LIST`` with 127.0.0.1 for each node of a
    two-node list: put it first on the PATH of a stand-in Slurm task."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / 'scontrol'
    script.write_text('#!/bin/sh\n[ "$1" = show ] || exit 1\necho 127.0.0.1\necho 127.0.0.1\n')
    script.chmod(0o755)
    return str(folder)


def stand_in_tasks(launcher: str, cmd: list[str], *, nodes: int, per_node: int, port: str, folder: Path,
                   env: dict | None = None, timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Start ``cmd`` once per task as ``srun`` (``launcher='slurm'``) or ``mpirun`` ('mpi') would on ``nodes`` x
    ``per_node`` tasks, with only the variables that launcher sets (Slurm: a node list of that many nodes, resolved
    by :func:`stand_in_scontrol`); return each task's result, in rank order."""
    base = dict(os.environ if env is None else env, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))
    for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'LOCAL_WORLD_SIZE', 'GROUP_RANK'):
        base.pop(name, None)
    world = nodes * per_node
    procs = []
    for rank in range(world):
        node, local = divmod(rank, per_node)
        if launcher == 'slurm':
            task = dict(SLURM_PROCID=str(rank), SLURM_LOCALID=str(local), SLURM_NODEID=str(node),
                        SLURM_NTASKS=str(world), SLURM_NNODES=str(nodes), SLURM_JOB_ID='1',
                        SLURM_NODELIST=f'node[1-{nodes}]' if nodes > 1 else 'node1', MASTER_PORT=port,
                        PATH=f'{stand_in_scontrol(folder / "bin")}:{base["PATH"]}')
        else:
            task = dict(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(world),
                        OMPI_COMM_WORLD_LOCAL_RANK=str(local), OMPI_COMM_WORLD_LOCAL_SIZE=str(per_node),
                        MASTER_ADDR='127.0.0.1', MASTER_PORT=port)
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=dict(base, **task), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results

