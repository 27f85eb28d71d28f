"""The fork server behind :func:`tests.tool_runner.run_python`: one interpreter per test process imports mmwf once
(torch, its compiler front end, timm, mmengine: about 4 s on 2 cores, what every tool imports first), then forks a
child for each run. The child becomes ``python ARGS`` as the interpreter would start it: the run's working folder,
environment, ``sys.argv`` as typed, ``sys.path[0]``, ``__main__`` and ``__file__``, fresh random seeds, standard
input from /dev/null, its output in the client's files, its exit status the interpreter's own. One difference
stays: every child has the server's hash seed (``PYTHONHASHSEED`` is read at start); a test that compares two runs'
set orders must use fresh interpreters.

Protocol, one JSON line each way: the server says ``{"ready": true}`` or ``{"refused": why}`` once; then for each
request ``{"argv", "cwd", "env", "stdout", "stderr"}`` it answers ``{"pid": pid}`` at the fork and
``{"returncode": code}`` (negative: the signal) when the child has ended."""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading


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
    the child ends with the run's exit status (:func:`_exit`)."""
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


def _run(request: dict, base_path: list[str]) -> int:
    import builtins
    import importlib.machinery
    import random
    import runpy

    import numpy as np
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, request['stdout']), (2, request['stderr'])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    random.seed()
    np.random.seed()
    for name in [m for m in sys.modules if m == 'tests' or m.startswith('tests.')]:
        del sys.modules[name]
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
    import atexit
    import ctypes
    import gc
    for step in (threading._shutdown, atexit._run_exitfuncs, gc.collect):
        try:
            step()
        except BaseException:  # noqa: BLE001  (the interpreter reports these and goes on)
            sys.excepthook(*sys.exc_info())
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    ctypes.CDLL(None).fflush(None)


def serve() -> None:
    """Import mmwf, then answer requests on standard input until it closes. A server whose import wrote anything
    to its output (caught at the file descriptors, not at ``sys.stdout``, which what the import built may hold)
    or started a thread refuses: the runs then take fresh interpreters."""
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 1)
        os.dup2(captured.fileno(), 2)
        try:
            import mmwf  # noqa: F401
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        captured.seek(0)
        printed = captured.read().decode(errors='replace')
    refused = None
    if printed:
        refused = f'importing mmwf printed: {printed[:500]!r}'
    elif threading.active_count() != 1:
        refused = f'importing mmwf started threads: {[t.name for t in threading.enumerate()]}'
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
