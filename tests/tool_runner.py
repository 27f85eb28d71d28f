"""A tool of the repository run as a user runs it (``python TOOL ARGS``), for the tests.

Each run is a process of its own with the run's folder, environment and arguments. A tool of ``tools/`` or a module
of mmwf (``-m mmwf...``) is forked from this test process's fork server (:mod:`mmwf.utils.fork_server`), which has
already imported mmwf: the import every such tool starts with (about 4 s on 2 cores) is paid once per test process,
not once per run. :func:`run_ranks` forks the ranks of a two-process run from two such servers. Every other run
takes a fresh interpreter: code given with ``-c`` (it may test what an import does),
other programs (mmdet's tools, a user's project), interpreter options, an environment that differs from the
server's in a variable not in :data:`RUNTIME_ONLY` (torch, Triton and mmwf read some at import), or
``MMWF_TOOLS_FORK=0``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from mmwf.utils.fork_server import ForkServer

ROOT = Path(__file__).resolve().parents[1]
# variables read only when a tool runs, never while mmwf is imported: a run may set them and still be forked
RUNTIME_ONLY = frozenset({'PYTEST_CURRENT_TEST', 'PYTHON', 'MASTER_ADDR', 'MASTER_PORT', 'PORT', 'RANK', 'LOCAL_RANK',
                          'WORLD_SIZE', 'LOCAL_WORLD_SIZE'})


def ours(argv: list[str], cwd: Path) -> bool:
    """Whether ``python ARGV`` from ``cwd`` runs a tool of ``tools/`` or a module of mmwf: each imports mmwf
    first."""
    if argv[0] == '-m':
        return argv[1] == 'mmwf' or argv[1].startswith('mmwf.')
    script = (cwd / argv[0]).resolve()
    return script.suffix == '.py' and script.is_relative_to(ROOT / 'tools')


_servers: dict[int, ForkServer] = {}


def fork_server(index: int = 0) -> ForkServer:
    """This process's ``index``-th fork server (several run ranks at once), started at its first use and again when
    stale."""
    server = _servers.get(index)
    if server is None or server.stale(dict(os.environ)):
        if server is not None:
            server.close()
        server = _servers[index] = ForkServer(os.environ, ROOT, RUNTIME_ONLY)
    return server


def fresh_python(argv: list[str], cwd: Path, env: dict, timeout: float | None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          env=env, timeout=timeout)


def run_python(argv: list[object], cwd: Path = ROOT, env: dict | None = None, timeout: float | None = None,
               fork: bool | None = None) -> subprocess.CompletedProcess:
    """``python ARGV`` from ``cwd`` with ``env`` (default: this process's), output captured as text, as
    ``subprocess.run`` returns it: forked from this process's fork server where that is the same run, else a fresh
    interpreter (the module's docstring). ``fork``: True forks any run the server can make (tests of the server),
    False never forks."""
    argv, cwd, env = [str(a) for a in argv], Path(cwd), dict(os.environ if env is None else env)
    if fork is None:
        fork = ours(argv, cwd) and os.environ.get('MMWF_TOOLS_FORK') != '0'
    server = fork_server() if fork else None
    if server is not None and server.serves(argv, env):
        return server.run(argv, cwd, env, timeout)
    return fresh_python(argv, cwd, env, timeout)


def run_ranks(argv: list[object], port: str, world: int = 2, cwd: Path = ROOT, env: dict | None = None,
              timeout: float | None = None) -> subprocess.CompletedProcess:
    """``python ARGV`` on ``world`` processes at once on this machine, each with the variables of torch's ``env://``
    rendezvous (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``):
    what mmengine's ``pytorch`` launcher and ``init_process_group`` read, without torchrun's agent (the launcher
    tests run torchrun itself). Each rank is forked from a fork server of its own where one serves it, else a fresh
    interpreter. As torchrun does, a failed rank ends the others. The result: the first failed rank's exit status
    (else 0), the ranks' outputs one after the other."""
    argv, env = [str(a) for a in argv], dict(os.environ if env is None else env)
    envs = [dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                 MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port)) for r in range(world)]
    servers = [fork_server(r) for r in range(world)] if os.environ.get('MMWF_TOOLS_FORK') != '0' else []
    forked = bool(servers) and all(server.serves(argv, e) for server, e in zip(servers, envs))
    procs = [] if forked else [
        subprocess.Popen([sys.executable, *argv], cwd=cwd, env=e, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True) for e in envs]
    results: dict[int, subprocess.CompletedProcess | BaseException] = {}
    ended: list[int] = []  # the ranks in the order they ended

    def rank(r: int) -> None:
        try:
            if forked:
                results[r] = servers[r].run(argv, cwd, envs[r], timeout)
            else:
                out, err = procs[r].communicate(timeout=timeout)
                results[r] = subprocess.CompletedProcess(procs[r].args, procs[r].returncode, out, err)
        except BaseException as err:  # noqa: BLE001  (handed to the caller below)
            results[r] = err
        ended.append(r)

    def end_the_others() -> None:
        for r in range(world):
            if r in results:
                continue
            if not forked:
                procs[r].kill()
            elif servers[r].child is not None:
                try:
                    os.kill(servers[r].child, signal.SIGKILL)
                except ProcessLookupError:  # it ended meanwhile
                    pass

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(world)]
    for thread in threads:
        thread.start()
    try:
        while any(thread.is_alive() for thread in threads):
            if any(isinstance(res, BaseException) or res.returncode != 0 for res in list(results.values())):
                end_the_others()  # as torchrun's agent does
            time.sleep(0.05)
    finally:  # interrupted: no rank outlives the call
        while any(thread.is_alive() for thread in threads):
            end_the_others()
            time.sleep(0.05)
    for r in ended:
        if isinstance(results[r], BaseException):
            raise results[r]
    first_failed = next((results[r].returncode for r in ended if results[r].returncode), 0)
    return subprocess.CompletedProcess([sys.executable, *argv], first_failed,
                                       ''.join(results[r].stdout for r in range(world)),
                                       ''.join(results[r].stderr for r in range(world)))


def typed_words(line: str, cwd: Path, env: dict | None = None) -> list[str]:
    """The words bash makes of a command ``line`` as a user types it in ``cwd`` (its ``$(...)`` run, its comment
    dropped), for a test to run the program they name (a ``python`` command through :func:`run_python`)."""
    return subprocess.run(['bash', '-c', f'printf "%s\\0" {line}'], cwd=cwd, env=env, capture_output=True, text=True,
                          check=True).stdout.split('\0')[:-1]


def run_tool(*args: object, cwd: Path = ROOT, env: dict | None = None, ok: bool | None = True,
             timeout: float | None = None) -> subprocess.CompletedProcess:
    """``python ARGS`` from ``cwd`` (the repository), output captured as text (:func:`run_python`). ``ok=True``: a
    non-zero exit fails the test with the tail of the output; ``ok=False``: so does a zero exit (the tool must
    refuse); None: either."""
    res = run_python(list(args), cwd=cwd, env=env, timeout=timeout)
    if ok is not None:
        assert (res.returncode == 0) == ok, res.stdout[-2000:] + res.stderr[-3000:]
    return res
