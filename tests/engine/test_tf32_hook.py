"""TF32Hook after a script that set TF32 through torch's legacy API, its new per-backend API or both: the hook and a
toy run go through, TF32 is as the hook says for the run, and every setting reads as before after it. In a process of
its own (tests/utils/tf32_run.py): TF32 is process-global state."""
import json

import pytest

from tests.tool_runner import run_python
from tests.utils.tf32_run import HOOK_CASES


@pytest.fixture(scope='module')
def observed(tmp_path_factory):
    out = tmp_path_factory.mktemp('tf32') / 'hook.json'
    # forked from the tools' fork server: a fresh interpreter's state after `import mmwf`, the helper's first
    # line, without its 4 s of imports
    res = run_python(['-m', 'tests.utils.tf32_run', 'hook', out], fork=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize('case', HOOK_CASES, ids=lambda case: '-'.join(map(str, case)))
def test_the_hook_runs_after_either_api_and_puts_tf32_back(observed, case):
    script, matmul, cudnn, run = case
    seen = observed[' '.join(map(str, case))]
    assert 'error' not in seen, seen
    before, during = seen['before'], seen['during']
    assert (during['matmul'] == 'tf32') == matmul
    assert (during['conv'] == 'tf32') == (during['rnn'] == 'tf32') == cudnn
    for switch, want in (('matmul', matmul), ('cudnn', cudnn)):
        if before[f'legacy {switch}'] != 'refused':  # a legacy flag that read reads the hook's value
            assert during[f'legacy {switch}'] == want
    assert seen['after'] == before
