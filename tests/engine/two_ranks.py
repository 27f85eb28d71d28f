"""Start a test module on two gloo processes with torch.distributed.run, as the multi-process tests do, and find
a free port for the tests that start the tools' own launchers."""
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> str:
    """A free local port for a rendezvous."""
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return str(probe.getsockname()[1])


def run_two_ranks(module: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node 2 -m MODULE OUT ARGS`` on a free port, one thread per
    process; the result's ``out`` is the folder the ranks wrote to. A rank aborted by C++'s std::terminate ('terminate
    called without an active exception': seen once, at start-up, on a loaded CPU) is a failure of the launch, not
    of what the test checks: the run is repeated once, in a fresh folder (``OUT/again``). Every other failure is
    returned as it is."""
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))
    for attempt in (out, out / 'again'):
        attempt.mkdir(parents=True, exist_ok=True)
        res = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_port',
                              free_port(), '-m', module, str(attempt), *args], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=300)
        res.out = attempt
        if res.returncode == 0 or 'terminate called without an active exception' not in res.stderr:
            break
    return res
