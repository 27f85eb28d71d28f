"""tests/tool_runner.py and its fork server (mmwf.utils.fork_server): a forked run sees the process a fresh
interpreter gives it, and ends as one."""
import json
import os
import signal
import subprocess

import pytest

from tests.tool_runner import ROOT, fork_server, ours, run_python

# what a run can see of its process: arguments, import path, folder, environment, main module, standard input
PROBE = '''
import json, os, random, sys
print(json.dumps(dict(argv=sys.argv, path=sys.path, cwd=os.getcwd(), env=dict(os.environ), name=__name__,
                      file=globals().get('__file__'), stdin=sys.stdin.read(), mmwf='mmwf' in sys.modules,
                      tests=[m for m in sys.modules if m.split('.')[0] == 'tests'], draw=random.random(),
                      main=sorted(k for k in vars(sys.modules['__main__']) if not k.startswith('_') or k in (
                          '__file__', '__name__', '__spec__', '__cached__')),
                      loader=type(globals().get('__loader__')).__name__)))
'''


def probe(tmp_path, fork: bool, how: str) -> dict:
    """What ``python -c PROBE``, ``python probe.py`` or ``python -m probe`` sees, run in ``tmp_path``."""
    (tmp_path / 'probe.py').write_text(PROBE)
    argv = {'code': ['-c', PROBE], 'path': ['probe.py'], 'module': ['-m', 'probe']}[how]
    res = run_python([*argv, 'a', '--b'], cwd=tmp_path, env=dict(os.environ, PORT='29400'), fork=fork)
    assert res.returncode == 0 and not res.stderr, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize('how', ['code', 'path', 'module'])
def test_a_forked_run_sees_what_a_fresh_interpreter_sees(tmp_path, how):
    assert fork_server().refused is None
    forked, fresh = probe(tmp_path, True, how), probe(tmp_path, False, how)
    assert forked['mmwf'] and not fresh['mmwf']  # the one difference: mmwf is imported, as every tool's first step
    assert forked['tests'] == fresh['tests'] == []
    for key in ('argv', 'path', 'cwd', 'env', 'name', 'file', 'stdin', 'main', 'loader'):
        assert forked[key] == fresh[key], key
    assert probe(tmp_path, True, how)['draw'] != forked['draw']  # seeded afresh, as each interpreter is


@pytest.mark.parametrize('code, status, last_line', [
    ('import sys; sys.exit(3)', 3, None),
    ("raise SystemExit('refused: no data')", 1, 'refused: no data'),
    ("raise ValueError('bad value')", 1, 'ValueError: bad value'),
    ("import atexit; atexit.register(lambda: print('at exit', flush=True)); print('body')", 0, None),
    ('import os, signal; os.kill(os.getpid(), signal.SIGKILL)', -signal.SIGKILL, None),
    ('raise SystemExit(True)', 1, None),
    ('raise SystemExit(2 ** 70)', 255, None),
    ('raise KeyboardInterrupt', -signal.SIGINT, 'KeyboardInterrupt'),
    ("import sys, io; sys.stdout = io.StringIO(); print('lost'); sys.__stdout__.write('kept')", 0, None)])
def test_a_forked_run_ends_as_a_fresh_interpreter_ends(code, status, last_line):
    assert fork_server().refused is None  # else fork=True runs fresh too
    forked, fresh = (run_python(['-c', code], fork=fork) for fork in (True, False))
    assert forked.returncode == fresh.returncode == status
    assert forked.stdout == fresh.stdout
    if last_line:
        assert forked.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == last_line


def test_a_forked_run_seeds_torch_and_numpy_as_a_fresh_interpreter_does():
    """Two runs draw different numbers from a generator that a new process seeds afresh (numpy's; torch's in torch
    2.14), the same numbers, a fresh run's, from one that starts at a fixed seed (torch's before)."""
    assert fork_server().refused is None
    code = 'import numpy, torch; print(torch.initial_seed(), torch.rand(3).tolist()); print(numpy.random.rand(2))'
    forked = [run_python(['-c', code], fork=True).stdout.splitlines() for _ in range(2)]
    fresh = [run_python(['-c', code], fork=False).stdout.splitlines() for _ in range(2)]
    assert all(len(lines) == 2 for lines in forked + fresh)
    for generator in (0, 1):  # torch, numpy
        assert (forked[0][generator] == forked[1][generator]) == (fresh[0][generator] == fresh[1][generator])
        if fresh[0][generator] == fresh[1][generator]:
            assert forked[0][generator] == fresh[0][generator]


def test_a_forked_run_writes_both_streams_in_order_to_one_file(tmp_path):
    """``ForkServer.run(output=FILE)``: as ``2>&1``, what the run wrote, in its order."""
    code = "import sys; print('out 1', flush=True); print('err 2', file=sys.stderr, flush=True); print('out 3')"
    res = fork_server().run(['-c', code], tmp_path, dict(os.environ), 60, output=tmp_path / 'log.txt')
    assert res.returncode == 0 and res.stdout is None
    assert (tmp_path / 'log.txt').read_text() == 'out 1\nerr 2\nout 3\n'


def test_a_forked_run_past_its_timeout_is_killed():
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(['-c', 'import time; time.sleep(60)'], fork=True, timeout=1)
    assert run_python(['-c', 'print(2)'], fork=True).stdout == '2\n'  # the server goes on


def test_which_runs_are_forked():
    assert ours(['tools/train.py', 'x.py'], ROOT) and ours(['-m', 'mmwf.configs', '--list'], ROOT)
    assert ours(['../tools/test.py'], ROOT / 'configs')
    assert not ours(['-c', 'import mmwf'], ROOT)  # code may test what an import does
    assert not ours(['-m', 'pytest'], ROOT) and not ours([str(ROOT / 'setup.py')], ROOT)


def test_every_tool_imports_mmwf():
    """The fork server's premise: a tool of tools/ imports mmwf, so a child of the server that has imported it
    already differs from a fresh run only in time."""
    import re
    tools = sorted((ROOT / 'tools').rglob('*.py'))
    assert len(tools) > 10
    for tool in tools:
        assert re.search(r'^\s*(from mmwf[.\w]* import|import mmwf)', tool.read_text(), re.M), tool
