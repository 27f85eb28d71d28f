"""Launch several processes for a test (a test module on two gloo processes, or a tool's own launcher), repeating a
launch that C++ aborted at start-up."""
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.tool_runner import run_ranks

ROOT = Path(__file__).resolve().parents[2]
ABORT = 'terminate called without an active exception'
TORCHRUN = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port']  # + a port


def free_port() -> str:
    """A free local port for a rendezvous."""
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return str(probe.getsockname()[1])


def repeat_aborted(launch: Callable[[Path, str], subprocess.CompletedProcess], out: Path) \
        -> subprocess.CompletedProcess:
    """``launch(folder, port)`` with ``folder = out``, its result's ``out`` that folder. A rank aborted by C++'s
    std::terminate ('terminate called without an active exception': seen at gloo's start-up on a loaded CPU) is a
    failure of the launch, not of what the test checks: the launch is repeated once, in a fresh folder
    (``OUT/again``) on a fresh port. Every other failure is returned as it is."""
    for attempt in (out, out / 'again'):
        res = launch(attempt, free_port())
        res.out = attempt
        if res.returncode == 0 or ABORT not in res.stderr:
            break
    return res


def run_launch(cmd: Callable[[Path, str], list[str]], out: Path, env: dict | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the launch of several processes ``cmd(folder, port)`` (a launcher's command line: torchrun, srun, mpirun,
    a tool's launch script; writing under ``folder``, meeting at ``port``, also given as the environment's ``PORT``
    for the tools' launch scripts) from the repository, through :func:`repeat_aborted`."""
    env = dict(os.environ if env is None else env)
    return repeat_aborted(lambda folder, port: subprocess.run(
        cmd(folder, port), cwd=ROOT, env=dict(env, PORT=port), capture_output=True, text=True, timeout=timeout), out)


def run_ranks_of(args: Callable[[Path], list[str]], out: Path, env: dict | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """``python ARGS(folder)`` on two ranks with torch's ``env://`` variables (:func:`tests.tool_runner.run_ranks`:
    each forked from a fork server, one thread each), through :func:`repeat_aborted`. What a tool does on two
    processes, not how a launcher starts them: tests/engine/test_launchers.py runs torchrun, srun and mpirun."""
    env = dict(os.environ if env is None else env, OMP_NUM_THREADS='1')

    def launch(folder: Path, port: str) -> subprocess.CompletedProcess:
        folder.mkdir(parents=True, exist_ok=True)
        return run_ranks(args(folder), port, env=env, timeout=timeout)
    return repeat_aborted(launch, out)


def run_two_ranks(module: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m MODULE OUT ARGS`` on two ranks (:func:`run_ranks_of`)."""
    return run_ranks_of(lambda folder: ['-m', module, str(folder), *args], out)
