"""TF32's process-global settings observed around :mod:`mmwf.utils.tf32_settings` (tests/utils/test_tf32_settings.py)
and :class:`~mmwf.engine.hooks.TF32Hook` (tests/engine/test_tf32_hook.py), in a fresh interpreter: each case runs in
a forked child of it, so that each starts from the same state (torch's own, then what the case's script sets) and
none sees another's. ``python -m tests.utils.tf32_run {helper,hook} OUT.json``: the observations, as JSON.

An observation reads every setting and flag (a legacy flag that torch refuses to read: ``'refused'``); ``later`` is the
observations after a script sets the new API's parents afterwards, which tells a setting that takes its parent's value
from one set to the same value on its own."""
import itertools
import json
import logging
import os
import sys
import tempfile

import torch
from mmengine.hooks import Hook

import mmwf  # noqa: F401  (registers the hooks)
from mmwf.engine.hooks import TF32Hook
from mmwf.utils.tf32_settings import cudnn_tf32, matmul_tf32, restore_tf32, set_tf32
from tests.toy import make_runner

B = torch.backends
READS = {
    'generic': lambda: B.fp32_precision, 'cuda': lambda: B.cudnn.fp32_precision,
    'matmul': lambda: B.cuda.matmul.fp32_precision, 'conv': lambda: B.cudnn.conv.fp32_precision,
    'rnn': lambda: B.cudnn.rnn.fp32_precision, 'mkldnn.matmul': lambda: B.mkldnn.matmul.fp32_precision,
    'legacy matmul': lambda: B.cuda.matmul.allow_tf32, 'legacy cudnn': lambda: B.cudnn.allow_tf32,
    'matmul precision': torch.get_float32_matmul_precision,
}
# what a script set before the run: torch's own state, the legacy API, the new API, and the two mixed
SCRIPTS = {
    'torch': lambda: None,
    'legacy': lambda: (setattr(B.cuda.matmul, 'allow_tf32', True), setattr(B.cudnn, 'allow_tf32', False)),
    'high': lambda: torch.set_float32_matmul_precision('high'),
    'medium': lambda: torch.set_float32_matmul_precision('medium'),
    'new: all tf32': lambda: setattr(B, 'fp32_precision', 'tf32'),
    'new: cuda ieee': lambda: setattr(B.cudnn, 'fp32_precision', 'ieee'),
    'new: matmul tf32': lambda: setattr(B.cuda.matmul, 'fp32_precision', 'tf32'),
    'new: matmul and all tf32': lambda: (setattr(B.cuda.matmul, 'fp32_precision', 'tf32'),
                                         setattr(B, 'fp32_precision', 'tf32')),
    'new: conv ieee': lambda: setattr(B.cudnn.conv, 'fp32_precision', 'ieee'),
    'mixed: high, then matmul ieee': lambda: (torch.set_float32_matmul_precision('high'),
                                              setattr(B.cuda.matmul, 'fp32_precision', 'ieee')),
}


def observe() -> dict:
    out = {}
    for name, read in READS.items():
        try:
            out[name] = read()
        except RuntimeError as e:
            assert 'of the legacy and new APIs' in str(e), e
            out[name] = 'refused'
    return out


def later() -> list[dict]:
    """The observations after each of a script's later settings of the new API's parents."""
    seen = []
    for parent in (B, B.cudnn):
        for value in ('ieee', 'tf32', 'none'):
            parent.fp32_precision = value
            seen.append(observe())
    return seen


def in_child(case, *args):
    """``case(*args)`` in a forked child of this process, its JSON result (or its error) back."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            result = case(*args)
        except BaseException as e:  # noqa: BLE001  (reported to the parent)
            result = dict(error=f'{type(e).__name__}: {e}')
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    data = b''
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data)


def script_alone(script: str) -> list[dict]:
    SCRIPTS[script]()
    return later()


def helper_case(script: str, matmul, cudnn) -> dict:
    SCRIPTS[script]()
    before = observe()
    state = set_tf32(matmul, cudnn)
    during = dict(observe(), matmul_tf32=matmul_tf32(), cudnn_tf32=cudnn_tf32())
    restore_tf32(state)
    return dict(before=before, during=during, after=observe(), later=later())


def helper() -> dict:
    """Every script with every (matmul, cudnn) of set_tf32 (None: left alone); ``control``: the script alone."""
    out = {}
    for script in SCRIPTS:
        out[script] = dict(control=in_child(script_alone, script))
        for matmul, cudnn in itertools.product((True, False, None), repeat=2):
            out[script][f'{matmul} {cudnn}'] = in_child(helper_case, script, matmul, cudnn)
    return out


def hook_case(script: str, matmul: bool, cudnn: bool, run: bool) -> dict:
    """TF32Hook(matmul, cudnn) after ``script``: its before_run and after_run, or a toy run of one iteration
    (``run``) whose probe reads the settings at the iteration."""
    SCRIPTS[script]()
    before, seen = observe(), {}

    class Probe(Hook):
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            seen.setdefault('during', observe())

    if run:
        with tempfile.TemporaryDirectory() as work_dir:
            make_runner(work_dir, 1, hooks=dict(tf32=dict(type='TF32Hook', matmul=matmul, cudnn=cudnn)),
                        custom_hooks=[Probe()]).train()
    else:
        class Runner:
            logger = logging.getLogger(__name__)

        hook = TF32Hook(matmul=matmul, cudnn=cudnn)
        hook.before_run(Runner())
        seen['during'] = observe()
        hook.after_run(Runner())
    return dict(before=before, during=seen['during'], after=observe())


# (script, matmul, cudnn, a toy run): the hook as the generation configs and as the others set it, after each API
HOOK_CASES = [(script, matmul, not matmul, False) for script in ('torch', 'legacy', 'new: all tf32', 'new: cuda ieee',
                                                                  'mixed: high, then matmul ieee')
              for matmul in (True, False)] + [('new: all tf32', True, False, True), ('legacy', False, True, True)]


def hook() -> dict:
    return {' '.join(map(str, case)): in_child(hook_case, *case) for case in HOOK_CASES}


if __name__ == '__main__':
    with open(sys.argv[2], 'w') as f:
        json.dump(dict(helper=helper, hook=hook)[sys.argv[1]](), f)
