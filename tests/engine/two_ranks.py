"""Launch several processes for a test (a test module on two gloo processes, or a tool's own launcher), repeating a
launch that C++ aborted at start-up."""
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ABORT = 'terminate called without an active exception'
TORCHRUN = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port']  # + a port


def free_port() -> str:
    """A free local port for a rendezvous."""
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return str(probe.getsockname()[1])


def run_launch(cmd: Callable[[Path, str], list[str]], out: Path, env: dict | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the launch of several processes ``cmd(folder, port)`` (writing under ``folder``, meeting at ``port``,
    also given as the environment's ``PORT`` for the tools' launch scripts) from the repository, with
    ``folder = out``; the result's ``out`` is that folder. A rank aborted by C++'s std::terminate ('terminate called
    without an active exception': seen at gloo's start-up on a loaded CPU) is a failure of the launch, not of what
    the test checks: the launch is repeated once, in a fresh folder (``OUT/again``) on a fresh port. Every other
    failure is returned as it is."""
    env = dict(os.environ if env is None else env)
    for attempt in (out, out / 'again'):
        port = free_port()
        res = subprocess.run(cmd(attempt, port), cwd=ROOT, env=dict(env, PORT=port), capture_output=True, text=True,
                             timeout=timeout)
        res.out = attempt
        if res.returncode == 0 or ABORT not in res.stderr:
            break
    return res


def run_two_ranks(module: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node 2 -m MODULE OUT ARGS`` through :func:`run_launch`, one
    thread per process."""
    def cmd(folder: Path, port: str) -> list[str]:
        folder.mkdir(parents=True, exist_ok=True)
        return [*TORCHRUN, port, '-m', module, str(folder), *args]
    return run_launch(cmd, out, dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT)), timeout=300)
