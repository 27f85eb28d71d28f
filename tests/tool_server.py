"""The fork server behind :func:`tests.tool_runner.run_python`: one interpreter per test process imports mmwf once
(torch, its compiler front end, timm, mmengine: about 4 s on 2 cores, what every tool imports first), then forks a
child for each run. The child becomes ``python ARGS`` as the interpreter would start it: the run's working folder,
environment, ``sys.argv`` and ``sys.path[0]``, fresh random seeds, standard input from /dev/null, its output in the
client's files, its exit status the interpreter's own (an uncaught exception prints its traceback and exits 1).

Protocol, one JSON line each way: the server says ``{"ready": true}`` or ``{"refused": why}`` once; then for each
request ``{"argv", "cwd", "env", "stdout", "stderr"}`` it answers ``{"pid": pid}`` at the fork and
``{"returncode": code}`` (negative: the signal) when the child has ended."""
from __future__ import annotations

import io
import json
import os
import sys
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
    try:
        if how == 'code':
            sys.argv = ['-c', *argv[2:]]
            exec(compile(what, '<string>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__})
        elif how == 'module':
            sys.argv = [what, *argv[2:]]
            runpy.run_module(what, run_name='__main__', alter_sys=True)
        else:
            sys.argv = [argv[0], *argv[1:]]
            runpy.run_path(what, run_name='__main__')
        code = 0
    except SystemExit as done:
        code = exit_code(done)
    except BaseException:  # noqa: BLE001  (what the interpreter does with an uncaught exception)
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code)


def exit_code(done: SystemExit) -> int:
    """The status the interpreter exits with for ``done``; a message that is not a number is printed to stderr."""
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    print(done.code, file=sys.stderr)
    return 1


def _exit(code: int) -> None:
    """End the child as the interpreter ends, less what no one observes: wait for the threads that are not daemons,
    run the ``atexit`` functions, collect garbage (finalizers, files closed), flush the standard streams; then leave
    without tearing down every module one by one (about 2 s with the stack imported)."""
    import atexit
    import gc
    threading._shutdown()
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def serve() -> None:
    """Import mmwf, then answer requests on standard input until it closes. A server whose import printed anything
    or started a thread refuses (the children would miss the output or hold a copied lock): the runs then take
    fresh interpreters."""
    captured = io.StringIO()
    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = captured
    try:
        import mmwf  # noqa: F401
    finally:
        sys.stdout, sys.stderr = real_out, real_err
    refused = None
    if captured.getvalue():
        refused = f'importing mmwf printed: {captured.getvalue()[:500]!r}'
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
