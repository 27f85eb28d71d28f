"""CompileHook: the configs' parts compiled in place on the devices named, eager elsewhere and where hooks read
inside, every path checked on every device."""
import logging
from types import SimpleNamespace

import pytest
import torch
from mmengine.config import Config

import mmwf  # noqa: F401
from mmwf.configs import config_files
from mmwf.engine.hooks import CompileHook
from mmwf.models.backbones import WeightFormer
from mmwf.models.necks import SimpleFeaturePyramid

TINY_WF = dict(embed_dims=32, depth=3, mlp_ratio=2)


class Detector(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = WeightFormer(TINY_WF, dynamic_blocks=[1])
        self.neck = SimpleFeaturePyramid(32, 16)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x):
        return [self.head(f.mean((2, 3))) for f in self.neck(self.backbone(x))]


def runner_of(model):
    return SimpleNamespace(model=model, logger=logging.getLogger('test_compile_hook'))


def compiled(module):
    return module._compiled_call_impl is not None  # what nn.Module.compile sets


def test_eager_on_a_device_not_listed(caplog):
    model = Detector()
    with caplog.at_level(logging.INFO, 'test_compile_hook'):
        CompileHook(['backbone', 'neck']).before_run(runner_of(model))
    assert not compiled(model.backbone) and not compiled(model.neck)
    assert "backbone, neck eager (the model is on cpu; it compiles on ('cuda',))" in caplog.text


def test_compiles_the_parts_in_place_and_leaves_the_rest():
    """On a listed device (the CPU here, dynamo's graphs on eager kernels): the parts compiled, their keys and
    outputs unchanged, the head eager."""
    model = Detector().eval()
    x = torch.randn(2, 3, 64, 80)
    keys = list(model.state_dict())
    with torch.no_grad():
        expected = model(x)
    torch._dynamo.reset()
    CompileHook(['backbone', 'neck'], devices=('cpu',), backend='eager').before_run(runner_of(model))
    assert compiled(model.backbone) and compiled(model.neck) and not compiled(model.head)
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        for a, b in zip(expected, model(x), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_a_part_with_forward_hooks_stays_eager(caplog):
    model = Detector()
    model.backbone.blocks[1].register_forward_hook(lambda m, i, o: None)
    with caplog.at_level(logging.INFO, 'test_compile_hook'):
        CompileHook(['backbone', 'neck'], devices=('cpu',), backend='eager').before_run(runner_of(model))
    assert not compiled(model.backbone) and compiled(model.neck)
    assert 'backbone eager: forward hooks read inside it' in caplog.text


def test_mistakes_are_named():
    with pytest.raises(ValueError, match=r"has no 'neck.lateral' to compile \(SimpleFeaturePyramid has no "
                                         r"'lateral'\).*default_hooks.compile.modules"):
        CompileHook(['backbone', 'neck.lateral']).before_run(runner_of(Detector()))
    with pytest.raises(ValueError, match="mode='fast' is not one of"):
        CompileHook(['backbone'], mode='fast')
    with pytest.raises(ValueError, match='a list of attribute paths'):
        CompileHook('backbone')


def test_mode_eager_is_the_switch(caplog):
    model = Detector()
    with caplog.at_level(logging.INFO, 'test_compile_hook'):
        CompileHook(['backbone'], mode='eager', devices=('cpu',)).before_run(runner_of(model))
    assert not compiled(model.backbone) and 'backbone eager (mode eager)' in caplog.text


def test_every_config_names_parts_its_model_has():
    """Each config's CompileHook paths exist in the model it builds (checked on the config's model config: the
    distillers' student, the detectors' and segmentors' backbone and neck, the denoiser)."""
    checked = 0
    for name, path in config_files().items():
        cfg = Config.fromfile(str(path))
        hook = cfg.get('default_hooks', {}).get('compile')
        assert hook is not None and hook['type'] == 'CompileHook', name
        for module in hook['modules']:
            node = cfg.model
            for part in module.split('.'):
                assert part in node, (name, module)
                node = node[part]
        checked += 1
    assert checked > 50
