"""A layer choice that runs a Triton kernel (conv='triton', form='fused'), called on CPU tensors where Triton cannot
run them (no GPU, no interpreter): refused by the choice's name, with the fix, where Triton would stop deep in its
launcher ("0 active drivers"). In a fresh interpreter without TRITON_INTERPRET, which this process has on a machine
without a GPU (tests/conftest.py) and which Triton reads when the kernels are defined."""
import json
import os

from tests.tool_runner import run_tool

SCRIPT = '''
import json, sys
import torch
from mmwf.models.layers import AdaptiveDynamicDWConv, BilateralDynamicLinear, StaticDWConv
x, seen = torch.randn(2, 12, 8), {}
layers = dict(static=(StaticDWConv(8, conv='triton'), 'conv'),  # built on the CPU without a word
              adaptive=(AdaptiveDynamicDWConv(8, conv='triton'), 'conv'),
              linear=(BilateralDynamicLinear(8, 8, form='fused'), 'form'))
for name, (layer, choice) in layers.items():
    try:
        layer(x, (3, 4))
        seen[name] = 'ran'
    except RuntimeError as e:
        seen[name] = str(e)
    setattr(layer, choice, 'auto')  # the fix the message names
    seen[name + ' auto'] = list(layer(x, (3, 4)).shape)
json.dump(seen, sys.stdout)
'''


def test_a_triton_choice_on_the_cpu_without_the_interpreter_is_refused_by_name():
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    seen = json.loads(run_tool('-c', SCRIPT, env=env).stdout)
    for name, choice, fix in (('static', "conv='triton'", "conv='auto'"), ('adaptive', "conv='triton'", "conv='auto'"),
                              ('linear', "form='fused'", "form='auto'")):
        message = seen[name]
        assert message.startswith(choice), message
        assert 'on a CUDA GPU' in message and 'TRITON_INTERPRET=1' in message and 'got tensors on the CPU' in message
        assert fix in message and 'active drivers' not in message
        assert seen[f'{name} auto'] == [2, 12, 8]
