"""A tool of the repository run as a user runs it (``python TOOL ARGS``), for the tests.

Each run is a process of its own with the run's folder, environment and arguments. A tool of ``tools/`` or a module
of mmwf (``-m mmwf...``) is forked from this test process's fork server (tests/tool_server.py), which has already
imported mmwf: the import every such tool starts with (about 4 s on 2 cores) is paid once per test process, not
once per run. Every other run takes a fresh interpreter: code given with ``-c`` (it may test what an import does),
other programs (mmdet's tools, a user's project), interpreter options, an environment that differs from the
server's in a variable not in :data:`RUNTIME_ONLY` (torch, Triton and mmwf read some at import), or
``MMWF_TOOLS_FORK=0``.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# variables read only when a tool runs, never while mmwf is imported: a run may set them and still be forked
RUNTIME_ONLY = frozenset({'PYTEST_CURRENT_TEST', 'PYTHON', 'MASTER_ADDR', 'MASTER_PORT', 'PORT', 'RANK', 'LOCAL_RANK',
                          'WORLD_SIZE'})


class ServerGone(Exception):
    """The fork server's pipe closed: it exited."""


class ForkServer:
    """This process's fork server (tests/tool_server.py), started at its first use with this process's
    environment, ended with the process. Its own output (a failed import) goes to ``self.log``."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.log = tempfile.NamedTemporaryFile(prefix='mmwf_fork_server_', suffix='.log', delete=False)
        self.proc = subprocess.Popen([sys.executable, '-c', 'from tests.tool_server import serve; serve()'],
                                     cwd=ROOT, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, bufsize=0)
        self.pending = b''
        try:
            hello = self.answer(300)
            self.refused = 'no answer in 300 s' if hello is None else hello.get('refused')
        except ServerGone:
            self.refused = f'it exited: {Path(self.log.name).read_text()[-2000:]}'
        atexit.register(self.close)

    def answer(self, timeout: float | None) -> dict | None:
        """The server's next line, or None when none came within ``timeout`` seconds; :class:`ServerGone` when
        it exited."""
        while b'\n' not in self.pending:
            if not select.select([self.proc.stdout], [], [], timeout)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise ServerGone(self.proc.poll())
            self.pending += chunk
        line, self.pending = self.pending.split(b'\n', 1)
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def stale(self) -> bool:
        """Whether a server that did not refuse has ended, or this process's environment changed since it started
        (a library set a variable): a new one is due."""
        return not self.refused and (self.proc.poll() is not None or not same_start(self.env, dict(os.environ)))

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a run with ``env`` sees the process a fresh interpreter would give it."""
        return not self.refused and self.proc.poll() is None and same_start(env, self.env)

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float | None) \
            -> subprocess.CompletedProcess:
        """``python ARGV`` forked. Anything unexpected (an interrupt, the server gone) ends the server, so that
        the protocol never falls out of step: the caller starts a new one."""
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp, 'stdout'), Path(tmp, 'stderr')
            request = dict(argv=argv, cwd=str(cwd), env=env, stdout=str(out), stderr=str(err))
            pid = None
            try:
                self.proc.stdin.write((json.dumps(request) + '\n').encode())
                pid = self.answer(None)['pid']
                done = self.answer(timeout)
                if done is None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:  # it ended meanwhile
                        pass
                    self.answer(None)
                    raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, out.read_text(),
                                                    err.read_text())
            except subprocess.TimeoutExpired:
                raise
            except BaseException:
                if pid is not None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self.proc.kill()
                self.proc.wait()
                raise
            return subprocess.CompletedProcess([sys.executable, *argv], done['returncode'],
                                               out.read_text(errors='replace'), err.read_text(errors='replace'))


def same_start(env: dict[str, str], other: dict[str, str]) -> bool:
    """Whether two environments differ only in :data:`RUNTIME_ONLY`."""
    return all(env.get(k) == other.get(k) for k in env.keys() | other.keys() if k not in RUNTIME_ONLY)


def ours(argv: list[str], cwd: Path) -> bool:
    """Whether ``python ARGV`` from ``cwd`` runs a tool of ``tools/`` or a module of mmwf: each imports mmwf
    first."""
    if argv[0] == '-m':
        return argv[1] == 'mmwf' or argv[1].startswith('mmwf.')
    script = (cwd / argv[0]).resolve()
    return script.suffix == '.py' and script.is_relative_to(ROOT / 'tools')


_server: ForkServer | None = None


def run_python(argv: list[object], cwd: Path = ROOT, env: dict | None = None, timeout: float | None = None,
               fork: bool | None = None) -> subprocess.CompletedProcess:
    """``python ARGV`` from ``cwd`` with ``env`` (default: this process's), output captured as text, as
    ``subprocess.run`` returns it: forked from this process's fork server where that is the same run, else a fresh
    interpreter (the module's docstring). ``fork``: True forks any run the server can make (tests of the server),
    False never forks."""
    global _server
    argv, cwd, env = [str(a) for a in argv], Path(cwd), dict(os.environ if env is None else env)
    if fork is None:
        fork = ours(argv, cwd) and os.environ.get('MMWF_TOOLS_FORK') != '0'
    if fork and (argv[0] in ('-c', '-m') or not argv[0].startswith('-')):
        if _server is None or _server.stale():
            if _server is not None:
                _server.close()
            _server = ForkServer()
        if _server.serves(env):
            return _server.run(argv, cwd, env, timeout)
    return subprocess.run([sys.executable, *argv], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          env=env, timeout=timeout)


def run_tool(*args: object, cwd: Path = ROOT, env: dict | None = None, ok: bool | None = True,
             timeout: float | None = None) -> subprocess.CompletedProcess:
    """``python ARGS`` from ``cwd`` (the repository), output captured as text (:func:`run_python`). ``ok=True``: a
    non-zero exit fails the test with the tail of the output; ``ok=False``: so does a zero exit (the tool must
    refuse); None: either."""
    res = run_python(list(args), cwd=cwd, env=env, timeout=timeout)
    if ok is not None:
        assert (res.returncode == 0) == ok, res.stdout[-2000:] + res.stderr[-3000:]
    return res
