"""The steps of a prepared check run (``tools/cuda_check.sh``): each a command in a process of its own, with a time
limit, whose output is logged and whose markdown tables are read back. A pytest step passes only where a test ran
and passed: one whose every test was skipped is "not run", never "passed". A step of ``python ARGS`` is forked from
one :class:`~mmwf.utils.fork_server.ForkServer` where it can be (about 5 s of start-up and teardown saved a step)."""
from __future__ import annotations

import os
import os.path as osp
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field

from mmwf.utils.fork_server import ForkServer, ServerGone

# what every step's environment adds: its output unbuffered, so that a step stopped at its time limit leaves it all
STEP_ENV = {'PYTHONUNBUFFERED': '1'}


@dataclass
class Step:
    """One check: ``argv`` run with ``env`` added, at most ``timeout`` seconds; skipped when ``need()`` returns a
    reason. ``junit``: the JUnit XML file of a pytest step; ``more_tables``: tables a passing step adds from its
    files."""
    name: str
    what: str
    argv: list[str]
    timeout: float
    need: Callable[[], str | None] = lambda: None
    env: dict[str, str] = field(default_factory=dict)
    junit: str | None = None
    more_tables: Callable[[], list[dict]] | None = None


def markdown_tables(text: str) -> list[dict]:
    """Every markdown table in ``text``: ``{'title': ..., 'columns': [...], 'rows': [[...], ...]}``, the title
    the line just above the table (the tools print one there when they print several tables), else empty."""
    tables, lines = [], text.splitlines()
    for i in range(len(lines) - 1):
        header, rule = lines[i].strip(), lines[i + 1].strip()
        if header.startswith('|') and rule.startswith('|---'):
            above = lines[i - 1].strip() if i else ''
            rows = []
            for line in lines[i + 2:]:
                if not line.strip().startswith('|'):
                    break
                rows.append([cell.strip() for cell in line.strip().strip('|').split('|')])
            tables.append(dict(title='' if above.startswith('|') else above,
                               columns=[c.strip() for c in header.strip('|').split('|')], rows=rows))
    return tables


def junit_tests(path: str) -> list[dict]:
    """The test cases of a pytest JUnit XML file: name, outcome, seconds and the message of a failure or skip."""
    if not osp.isfile(path):
        return []
    tests = []
    for case in ET.parse(path).getroot().iter('testcase'):
        outcome, message = 'passed', ''
        for tag in ('failure', 'error', 'skipped'):
            node = case.find(tag)
            if node is not None:
                outcome, message = tag, node.get('message', '')
        tests.append(dict(name=case.get('name'), outcome=outcome, seconds=float(case.get('time', 0)),
                          message=message[:500]))
    return tests


def step_server(cwd: str) -> ForkServer:
    """The fork server for a run's steps: this process's environment with :data:`STEP_ENV`, started in ``cwd``."""
    return ForkServer({**os.environ, **STEP_ENV}, cwd)


def run_step(step: Step, timeout: float, log, cwd: str, server: ForkServer | None = None) -> dict:
    """Run one step from ``cwd``, forked from ``server`` where it serves the step (``python ARGS`` in an environment
    that starts as the server's), else in a fresh process; its output goes to ``log``, its result (status, reason,
    seconds, tables, the output's tail, how it started) is returned."""
    result = dict(name=step.name, what=step.what, command=' '.join(step.argv), env=step.env)
    reason = step.need()
    if reason:
        return dict(result, status='skipped', reason=reason, seconds=0.0, tables=[])
    log.write(f'\n===== {step.name}: {result["command"]}\n')
    log.flush()
    start = time.perf_counter()
    env = {**os.environ, **STEP_ENV, **step.env}
    forked = (server is not None and step.argv[0] == sys.executable and len(step.argv) > 1
              and server.serves(step.argv[1:], env))
    try:
        proc = None
        if forked:
            try:
                proc = server.run(step.argv[1:], cwd, env, timeout)
            except (ServerGone, OSError, ValueError) as err:  # the server failed, not the step: run it fresh
                log.write(f'the fork server failed ({err!r}): {step.name} starts in a fresh interpreter\n')
                forked = False
        if proc is None:
            proc = subprocess.run(step.argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        output, status = proc.stdout + proc.stderr, 'passed' if proc.returncode == 0 else 'failed'
        reason = '' if proc.returncode == 0 else f'exit status {proc.returncode}'
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b'').decode(errors='replace') + (err.stderr or b'').decode(errors='replace')
        status, reason = 'failed', f'stopped after {timeout:.0f} s (its time limit)'
    log.write(output)
    log.flush()
    if status == 'passed' and step.junit:  # a pytest step: passed only where a test ran and passed
        cases = junit_tests(step.junit)
        if not any(case['outcome'] == 'passed' for case in cases):
            skipped = [case for case in cases if case['outcome'] == 'skipped']
            status = 'not run'
            reason = (f'every test skipped ({len(skipped)}: {skipped[0]["message"]})' if skipped
                      else 'no test ran')
    tables = markdown_tables(output)
    if status == 'passed' and step.more_tables:
        tables += step.more_tables()
    return dict(result, status=status, reason=reason, seconds=round(time.perf_counter() - start, 1),
                tables=tables, output_tail=output[-3000:], started='forked' if forked else 'fresh')
