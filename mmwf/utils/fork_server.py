"""Many runs of ``python ARGS`` for the price of one start-up: a server interpreter imports mmwf once (torch, its
compiler front end, timm, mmengine: about 4 s on 2 cores, what every tool of mmwf imports first), then forks a child
for each run. The child becomes ``python ARGS`` as the interpreter would start it: the run's working folder,
environment, ``sys.argv`` as typed, ``sys.path[0]``, ``__main__`` and ``__file__``, fresh random seeds (torch's as a
new process seeds it), standard input from /dev/null, its output in the client's files, its exit
status the interpreter's own. One difference stays: every child has the server's hash seed (``PYTHONHASHSEED`` is
read at start); runs that compare set orders need fresh interpreters.

The server refuses, and the client then runs fresh interpreters, where importing mmwf printed anything, started a
thread or left CUDA unusable in a forked child. A child of a process whose CUDA driver is initialised cannot use the
device, and asking whether CUDA is available initialises it (mmengine asks at import): the server imports mmwf with
``PYTORCH_NVML_BASED_CUDA_CHECK=1``, so that the question goes to NVML, and where NVML sees a device it checks that a
forked child can use it.

This file imports nothing of mmwf at its top: the server loads it by path, so that the import of mmwf it times and
checks is the first. Protocol, one JSON line each way: the server says ``{"ready": true}`` or ``{"refused": why}``
once; then for each request ``{"argv", "cwd", "env", "stdout", "stderr"}`` it answers ``{"pid": pid}`` at the fork
and ``{"returncode": code}`` (negative: the signal) when the child has ended."""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


def main_target(argv: list[str], cwd: str) -> tuple[str, str, str]:
    """(how, what, ``sys.path[0]``) of ``python ARGV`` started in ``cwd``: ``('path', script, its folder)``,
    ``('module', name, cwd)`` or ``('code', text, '')``, as the interpreter reads its command line."""
    if argv[0] == '-c':
        return 'code', argv[1], ''
    if argv[0] == '-m':
        return 'module', argv[1], cwd
    script = os.path.join(cwd, argv[0])
    return 'path', script, os.path.dirname(os.path.realpath(script))


def _become(request: dict, base_path: list[str]) -> None:
    """In the forked child: take on the run's process state, then run its main as ``__main__``. Never returns:
    the child ends with the run's exit status (:func:`_finish`, then ``os._exit``)."""
    code = 1
    try:
        code = _run(request, base_path)
    except SystemExit as done:
        code = exit_code(done)
    except KeyboardInterrupt:  # as the interpreter does: the traceback, then die of SIGINT
        sys.excepthook(*sys.exc_info())
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001  (what the interpreter does with an uncaught exception)
        sys.excepthook(*sys.exc_info())
    finally:
        _finish()
        os._exit(code)


def _fresh_seeds() -> None:
    """Seed Python's and numpy's generators from the system, as a new interpreter does; torch's CPU generator too
    where torch seeds it so in each new process (a seed other than a new ``torch.Generator``'s fixed one). Where
    torch starts at the fixed seed, the server's state after the import is what a fresh run's import leaves."""
    import random
    random.seed()
    if 'numpy' in sys.modules:
        sys.modules['numpy'].random.seed()
    torch = sys.modules.get('torch')
    if torch is not None and torch.initial_seed() != torch.Generator().initial_seed():
        torch.default_generator.seed()  # the CPU generator only: a new process seeds no device's from it


def _run(request: dict, base_path: list[str]) -> int:
    import builtins
    import importlib.machinery
    import runpy
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, path in ((1, request['stdout']), (2, request['stderr'])):
        if fd == 2 and path == request['stdout']:  # one file for both, as 2>&1
            os.dup2(1, 2)
            continue
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    _fresh_seeds()
    argv = request['argv']
    how, what, first = main_target(argv, request['cwd'])
    sys.path[:] = [first, *base_path]
    main = sys.modules['__main__']  # the server's own: the run's main module in its place, as the interpreter's
    main.__dict__.clear()
    main.__dict__.update(__name__='__main__', __builtins__=builtins, __doc__=None, __package__=None, __spec__=None)
    if how == 'module':
        sys.argv = [what, *argv[2:]]  # runpy puts the module's file in argv[0], as `python -m` does
        runpy._run_module_as_main(what, alter_argv=True)
        return 0
    if how == 'code':
        sys.argv = ['-c', *argv[2:]]
        source, filename = what, '<string>'
        main.__dict__['__loader__'] = importlib.machinery.BuiltinImporter
    else:
        sys.argv = list(argv)  # the path as typed
        filename = os.path.abspath(what)
        with open(filename, 'rb') as f:
            source = f.read()
        main.__dict__.update(__file__=filename, __cached__=None,
                             __loader__=importlib.machinery.SourceFileLoader('__main__', filename))
    exec(compile(source, filename, 'exec'), main.__dict__)
    return 0


def exit_code(done: SystemExit) -> int:
    """The status the interpreter exits with for ``done``; a message that is not a number is printed to stderr."""
    code = done.code
    if code is None:
        return 0
    if isinstance(code, int):  # True is 1; out of a C int's range the interpreter exits with -1 (255)
        return code & 0xFF if -2 ** 31 <= code < 2 ** 31 else 255
    print(code, file=sys.stderr)
    return 1


def _finish() -> None:
    """What the interpreter does at exit that anyone observes: wait for the threads that are not daemons, run the
    ``atexit`` functions, collect garbage (finalizers, files closed), flush every stream, C's too. Not done: the
    teardown of every module one by one (about 2 s with the stack imported)."""
    import gc
    for step in (threading._shutdown, atexit._run_exitfuncs, gc.collect):
        try:
            step()
        except BaseException:  # noqa: BLE001  (the interpreter reports these and goes on)
            sys.excepthook(*sys.exc_info())
    _flush_output()


def _flush_output() -> None:
    """Write out what Python's streams and C's stdio hold."""
    import ctypes
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    ctypes.CDLL(None).fflush(None)


def import_refusal() -> str | None:
    """Import mmwf with its output caught at the file descriptors (not at ``sys.stdout``, which what the import
    built may hold); why children of this process would not be the runs a fresh interpreter makes, or None."""
    saved = os.dup(1), os.dup(2)
    nvml_check = os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK')
    os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'  # "is CUDA available?" asks NVML, not the driver
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 1)
        os.dup2(captured.fileno(), 2)
        try:
            import mmwf  # noqa: F401
        finally:
            _flush_output()  # what the import buffered goes to the capture, not to the replies
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            if nvml_check is None:
                del os.environ['PYTORCH_NVML_BASED_CUDA_CHECK']
            else:
                os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = nvml_check
        captured.seek(0)
        printed = captured.read().decode(errors='replace')
    if printed:
        return f'importing mmwf printed: {printed[:500]!r}'
    if threading.active_count() != 1:
        return f'importing mmwf started threads: {[t.name for t in threading.enumerate()]}'
    return cuda_fork_problem()


def cuda_fork_problem() -> str | None:
    """Why a child forked from this process could not use CUDA, or None: CUDA initialised here, or, where NVML sees a
    device, a forked probe that fails to put a tensor on it."""
    torch = sys.modules['torch']
    if torch.cuda.is_initialized():
        return 'importing mmwf initialised CUDA: a forked child could not use the device'
    if not torch.cuda._is_compiled() or torch.cuda._device_count_nvml() <= 0:
        return None  # no device that a child could use
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            torch.zeros(1, device='cuda')
            torch.cuda.synchronize()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return 'a child forked after importing mmwf could not use CUDA (the driver was initialised by the import)'
    return None


def serve() -> None:
    """Import mmwf, then answer requests on standard input until it closes (the module's docstring)."""
    refused = import_refusal()
    print(json.dumps({'refused': refused} if refused else {'ready': True}), flush=True)
    if refused:
        return
    base_path = sys.path[1:]  # the interpreter's own, after the '' of `-c`
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become(request, base_path)
        print(json.dumps({'pid': pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({'returncode': os.waitstatus_to_exitcode(status)}), flush=True)


# the server's command: this file loaded by its path, not as a module of mmwf (the module's docstring)
SERVE = ("import importlib.util as u; s = u.spec_from_file_location('fork_server', {path!r}); m = "
         "u.module_from_spec(s); s.loader.exec_module(m); m.serve()")


class ServerGone(Exception):
    """The fork server's pipe closed: it exited."""


class ForkServer:
    """A fork server started with ``env`` in ``cwd``, ended with this process or :meth:`close`. A run is forked
    from it where its environment differs from ``env`` only in ``runtime_only``: variables read when a run runs,
    never while mmwf is imported (torch, Triton and mmwf read some at import). ``refused``: why the server serves
    nothing (its import printed, started a thread or left CUDA unusable in a child; it exited; it did not answer)."""

    def __init__(self, env: dict[str, str], cwd: str | Path, runtime_only: frozenset[str] = frozenset()) -> None:
        self.env, self.runtime_only = dict(env), runtime_only
        self.log = tempfile.NamedTemporaryFile(prefix='mmwf_fork_server_', suffix='.log', delete=False)
        self.proc = subprocess.Popen([sys.executable, '-c', SERVE.format(path=os.path.abspath(__file__))],
                                     cwd=cwd, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, bufsize=0)
        self.pending = b''
        self.child: int | None = None  # the pid of the run under way
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
        if self.child is not None:  # a run under way (its caller was interrupted): it ends with the server
            try:
                os.kill(self.child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def same_start(self, env: dict[str, str]) -> bool:
        """Whether a run with ``env`` imports mmwf as the server did: the two differ only in ``runtime_only``."""
        return all(env.get(k) == self.env.get(k) for k in env.keys() | self.env.keys() if k not in self.runtime_only)

    def stale(self, env: dict[str, str]) -> bool:
        """Whether a server that did not refuse has ended, or ``env`` (its starter's, now) no longer starts as it
        did: a new one is due."""
        return not self.refused and (self.proc.poll() is not None or not self.same_start(env))

    def serves(self, argv: list[str], env: dict[str, str]) -> bool:
        """Whether ``python ARGV`` with ``env`` forked is the process a fresh interpreter would give it: a script,
        ``-m`` or ``-c`` (no interpreter options) and an environment that starts as the server's."""
        return (not self.refused and self.proc.poll() is None and (argv[0] in ('-c', '-m') or argv[0][:1] != '-')
                and self.same_start(env))

    def run(self, argv: list[str], cwd: str | Path, env: dict[str, str], timeout: float | None,
            output: str | Path | None = None) -> subprocess.CompletedProcess:
        """``python ARGV`` forked, output captured as text, as ``subprocess.run`` returns it, or both streams
        written to the file ``output`` (then None in the result); ``subprocess.TimeoutExpired`` (with the output
        so far) past ``timeout``. Anything unexpected (an interrupt, the server gone) ends the server, so that the
        protocol never falls out of step."""
        with tempfile.TemporaryDirectory() as tmp:
            out = err = Path(output).absolute() if output else None  # the child opens it from the server's folder
            if not output:
                out, err = Path(tmp, 'stdout'), Path(tmp, 'stderr')
            request = dict(argv=argv, cwd=str(Path(cwd).absolute()), env=env, stdout=str(out), stderr=str(err))
            pid = None
            try:
                self.proc.stdin.write((json.dumps(request) + '\n').encode())
                pid = self.child = self.answer(None)['pid']
                done = self.answer(timeout)
                if done is None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:  # it ended meanwhile
                        pass
                    self.answer(None)
                    raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, out.read_bytes(),
                                                    None if output else err.read_bytes())
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
            finally:
                self.child = None
            if output:
                return subprocess.CompletedProcess([sys.executable, *argv], done['returncode'])
            return subprocess.CompletedProcess([sys.executable, *argv], done['returncode'],
                                               out.read_text(errors='replace'), err.read_text(errors='replace'))
