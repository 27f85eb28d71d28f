"""mmwf.utils.tf32_settings: TF32 read, set and put back whichever of torch's APIs a script set before, observed in a
process of its own (tests/utils/tf32_run.py: TF32 is process-global state), and on a torch without the new API
(stand-ins for torch's flags)."""
import json

import pytest
import torch

from mmwf.utils import tf32_settings as tf32_module
from mmwf.utils.tf32_settings import cudnn_tf32, matmul_tf32, restore_tf32, set_tf32, tf32
from tests.tool_runner import run_python
from tests.utils.tf32_run import SCRIPTS

SWITCHES = [(m, c) for m in (True, False, None) for c in (True, False, None)]


@pytest.fixture(scope='module')
def observed(tmp_path_factory):
    out = tmp_path_factory.mktemp('tf32') / 'helper.json'
    # forked from the tools' fork server: a fresh interpreter's state after `import mmwf`, the helper's first
    # line, without its 4 s of imports
    res = run_python(['-m', 'tests.utils.tf32_run', 'helper', out], fork=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


def tf32_in(value: str) -> bool:
    return value == 'tf32'


@pytest.mark.parametrize('script', list(SCRIPTS))
def test_settings_are_set_in_both_apis_and_put_back(observed, script):
    """After each script (torch's state, the legacy API, the new API, the two mixed), for each (matmul, cudnn):
    TF32 is in force as asked; a legacy flag that read before reads the asked value (torch's inductor reads
    ``get_float32_matmul_precision()``); every read is as before once restored, refusals included; and settings the
    script makes later act as on the script's state alone, except in torch's initial cuDNN conv / RNN setting, which
    no API writes back (documented)."""
    control = observed[script]['control']
    for matmul, cudnn in SWITCHES:
        case = observed[script][f'{matmul} {cudnn}']
        assert 'error' not in case, case
        before, during = case['before'], case['during']
        for switch, want, settings in (('matmul', matmul, ('matmul',)), ('cudnn', cudnn, ('conv', 'rnn'))):
            for setting in settings:
                expected = tf32_in(before[setting]) if want is None else want
                assert tf32_in(during[setting]) == expected, (script, matmul, cudnn, setting, during)
            assert during[f'{switch}_tf32'] == tf32_in(during[settings[0]])
            if want is not None and before[f'legacy {switch}'] != 'refused':
                assert during[f'legacy {switch}'] == want, (script, matmul, cudnn, switch, during)
        # torch's legacy enum cannot say "CUDA matmul IEEE, oneDNN's TF32 / bf16" (set_float32_matmul_precision's
        # 'high' / 'medium' then matmul=False): that read is refused for the run
        if before['matmul precision'] != 'refused' and not (matmul is False and
                                                             before['mkldnn.matmul'] in ('tf32', 'bf16')):
            assert during['matmul precision'] != 'refused', (script, matmul, cudnn, during)
        assert case['after'] == before, (script, matmul, cudnn)
        cudnn_written = cudnn is not None and any(tf32_in(before[s]) != cudnn for s in ('conv', 'rnn'))
        unwritable = {'conv', 'rnn', 'legacy cudnn'} if cudnn_written and script != 'legacy' else set()
        for seen, expected in zip(case['later'], control, strict=True):
            assert {k: v for k, v in seen.items() if k not in unwritable} == \
                {k: v for k, v in expected.items() if k not in unwritable}, (script, matmul, cudnn)


def test_a_setting_that_takes_its_parents_value_takes_it_again(observed):
    """``torch.backends.fp32_precision = 'tf32'`` alone: the matmul setting follows it ('none'); with the matmul
    set to 'tf32' too, the same read, but its own: a later 'ieee' for all leaves that one at 'tf32'."""
    follows, own = observed['new: all tf32']['False None'], observed['new: matmul and all tf32']['False None']
    assert follows['before']['matmul'] == own['before']['matmul'] == 'tf32'
    assert follows['later'][0]['matmul'] == 'ieee' and own['later'][0]['matmul'] == 'tf32'  # generic 'ieee'


class Flags:
    """A torch without the per-backend API: ``allow_tf32`` alone, with its writes counted."""

    def __init__(self, value: bool):
        self.value, self.writes = value, 0

    @property
    def allow_tf32(self) -> bool:
        return self.value

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        self.value, self.writes = value, self.writes + 1


@pytest.fixture
def older_torch(monkeypatch):
    matmul, cudnn = Flags(False), Flags(True)
    monkeypatch.setattr(torch.backends.cuda, 'matmul', matmul)
    monkeypatch.setattr(torch.backends, 'cudnn', cudnn)
    return matmul, cudnn


def test_older_torch_takes_the_legacy_flags(older_torch):
    matmul, cudnn = older_torch
    assert not tf32_module._new_api()
    assert (matmul_tf32(), cudnn_tf32()) == (False, True)
    state = set_tf32(matmul=True, cudnn=False)
    assert (matmul.value, cudnn.value, matmul_tf32(), cudnn_tf32()) == (True, False, True, False)
    restore_tf32(state)
    assert (matmul.value, cudnn.value) == (False, True)
    with tf32(matmul=False, cudnn=True):  # both as they are: nothing written, nothing put back
        pass
    assert (matmul.writes, cudnn.writes) == (2, 2)


def test_older_torch_leaves_the_new_api_alone(older_torch):
    """The stand-ins took the writes: torch's own settings read as before."""
    before = torch.backends.fp32_precision, torch._C._get_fp32_precision_getter('cuda', 'matmul')
    with tf32(matmul=True, cudnn=False):
        pass
    assert (torch.backends.fp32_precision, torch._C._get_fp32_precision_getter('cuda', 'matmul')) == before
