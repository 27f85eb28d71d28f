"""CompileHook: the configs' parts compiled in place on the devices named, eager elsewhere and where hooks read
inside, every path checked on every device; a compile that fails (a test backend that raises, in training or at the
first validation) runs that part eager with one warning, or raises with ``strict=True``, and an error of the model's
own is raised as eager raises it; each part's recompile limit is its own and its warning reaches the run's log."""
import logging
from types import SimpleNamespace

import pytest
import torch
from mmengine.config import Config
from mmengine.evaluator import Evaluator

import mmwf  # noqa: F401
from mmwf.configs import config_files
from mmwf.engine.hooks import CompileHook
from mmwf.models.backbones import WeightFormer
from mmwf.models.necks import SimpleFeaturePyramid
from tests.toy import ToyData, ToyMetric, ToyModel, make_runner

TINY_WF = dict(embed_dims=32, depth=3, mlp_ratio=2)


@pytest.fixture(autouse=True)
def _reset_dynamo():
    """dynamo's caches and what a part past its limit left on the shared code object, cleared after each test."""
    yield
    torch._dynamo.reset()


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


# --- compiling never costs a run: a failing compile falls back to eager, once, with one warning ----------------------

class Net(torch.nn.Module):
    """A backbone of a few layers and a head, cheap to trace."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                                            torch.nn.Linear(16, 8))
        self.neck = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.neck(self.backbone(x)))


class Backend:
    """A dynamo backend that fails to compile the graphs ``fails`` selects (``'train'``: gradients on, ``'eval'``:
    off, ``'all'``, ``None``) and runs the others as traced; it counts both."""

    def __init__(self, fails: str | None = 'all'):
        self.fails, self.failed, self.graphs = fails, 0, 0

    def __call__(self, gm, example_inputs):
        mode = 'train' if torch.is_grad_enabled() else 'eval'
        if self.fails in ('all', mode):
            self.failed += 1
            raise RuntimeError(f'lowering failed in {mode} (test backend)')
        self.graphs += 1
        return gm.forward


def compiled_net(backend, **options):
    """A Net compiled by the hook on the CPU, its eager twin (the same weights) and the log records."""
    model = Net()
    eager = Net()
    eager.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    CompileHook(['backbone', 'neck'], devices=('cpu',), backend=backend, **options).before_run(runner_of(model))
    return model, eager


def step(model, x):
    """One training step's outputs and gradients (the same loss for both runs)."""
    model.train()
    out = model(x)
    grads = torch.autograd.grad(out.square().mean(), list(model.parameters()))
    return out.detach(), grads


def evaluate(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


def warnings_of(caplog, text='CompileHook: compiling'):
    return [r for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_a_compile_failing_in_training_runs_that_part_eager(caplog):
    """The first step's compile fails: the step is run eagerly (the results are eager's, bit for bit: the same kernels
    on the same inputs), the part is eager from then on, with one warning naming the part and the compiler's error;
    the settings of the call are restored."""
    backend = Backend('all')
    model, eager = compiled_net(backend)
    x = torch.randn(4, 8)
    with caplog.at_level(logging.INFO, 'test_compile_hook'):
        out, grads = step(model, x)
        out2, _ = step(model, x)
        evaluated = evaluate(model, x)
    expected, expected_grads = step(eager, x)
    assert torch.equal(out, expected) and torch.equal(out2, expected) and torch.equal(evaluated, evaluate(eager, x))
    for a, b in zip(grads, expected_grads, strict=True):
        assert torch.equal(a, b)
    assert backend.failed == 2 and backend.graphs == 0  # each part failed once: never compiled again
    assert not compiled(model.backbone) and not compiled(model.neck)
    messages = [r.getMessage() for r in warnings_of(caplog)]
    assert len(messages) == 2, messages  # one per part
    assert messages[0].startswith('CompileHook: compiling backbone failed (BackendCompilerFailed from RuntimeError: '
                                  'lowering failed in train (test backend)); backbone runs eager from here')
    assert 'default_hooks.compile.strict=True' in messages[0]
    assert not torch._functorch.config.force_non_lazy_backward_lowering
    assert not logging.getLogger('torch._dynamo.convert_frame').handlers


def test_a_compile_failing_at_the_first_validation_runs_that_part_eager(caplog):
    """Training compiles; the first validation (a new graph: eval mode, no gradients) fails to compile: it is run
    eagerly, with eager's results, and the part stays eager; training before it ran compiled."""
    backend = Backend('eval')
    model, eager = compiled_net(backend)
    x = torch.randn(4, 8)
    with caplog.at_level(logging.INFO, 'test_compile_hook'):
        out, grads = step(model, x)
        assert compiled(model.backbone) and backend.graphs == 2 and not warnings_of(caplog)
        evaluated = evaluate(model, x)
    assert torch.equal(evaluated, evaluate(eager, x))
    expected, expected_grads = step(eager, x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)  # traced graphs run eager's kernels
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not compiled(model.backbone) and not compiled(model.neck)
    assert [r.getMessage().split(';')[0] for r in warnings_of(caplog)] == [
        f'CompileHook: compiling {part} failed (BackendCompilerFailed from RuntimeError: lowering failed in eval '
        '(test backend))' for part in ('backbone', 'neck')]


@pytest.mark.parametrize('fails', ['train', 'eval'])
def test_strict_raises_the_compile_error(fails, caplog):
    backend = Backend(fails)
    model, _ = compiled_net(backend, strict=True)
    x = torch.randn(4, 8)
    with caplog.at_level(logging.INFO, 'test_compile_hook'):
        if fails == 'eval':
            step(model, x)
        with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=f'lowering failed in {fails}'):
            step(model, x) if fails == 'train' else evaluate(model, x)
    assert compiled(model.backbone) and not warnings_of(caplog)
    assert not torch._functorch.config.force_non_lazy_backward_lowering


def test_an_error_of_the_model_itself_is_raised_as_eager_raises_it(caplog):
    """A wrong input size fails eagerly too: eager's error propagates (not dynamo's), nothing chained to it, and the
    part stays compiled without a warning."""
    model, eager = compiled_net(Backend(None))
    x = torch.randn(4, 8)
    step(model, x)
    with pytest.raises(RuntimeError) as expected:
        eager(torch.randn(4, 7))
    with caplog.at_level(logging.INFO, 'test_compile_hook'), pytest.raises(RuntimeError) as raised:
        model(torch.randn(4, 7))
    assert type(raised.value) is type(expected.value) and str(raised.value) == str(expected.value)
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    assert compiled(model.backbone) and compiled(model.neck) and not warnings_of(caplog)


def test_a_backward_failing_to_compile_is_caught_in_the_forward(caplog):
    """AOT autograd compiles the backward at the first ``backward()`` unless told otherwise, where no part's call could
    catch it; the hook has it compiled with the forward, so its failure falls back there and the gradients are
    eager's."""
    from torch._dynamo.backends.common import aot_autograd

    def failing_backward(gm, example_inputs):
        raise RuntimeError('backward lowering failed (test backend)')

    model, eager = compiled_net(aot_autograd(fw_compiler=lambda gm, example_inputs: gm.forward,
                                             bw_compiler=failing_backward))
    x = torch.randn(4, 8)
    with caplog.at_level(logging.INFO, 'test_compile_hook'):
        out, grads = step(model, x)
    expected, expected_grads = step(eager, x)
    assert torch.equal(out, expected)
    for a, b in zip(grads, expected_grads, strict=True):
        assert torch.equal(a, b)
    assert 'RuntimeError: backward lowering failed' in warnings_of(caplog)[0].getMessage()
    assert not compiled(model.backbone)


@pytest.mark.parametrize('per_call', [True, False], ids=['torch.compile-limit', 'config-set-around-the-call'])
def test_a_part_past_its_recompile_limit_says_so_and_the_others_compile(per_call, monkeypatch, caplog):
    """``recompile_limit=2``: the backbone's third input rank runs eager with one warning in the run's log naming the
    part and the fix; the neck, compiled by the same ``Module._call_impl``, still compiles its own graphs (with
    torch.compile's per-call limit; dynamo's global one would stop every part's new graphs). Where torch.compile has
    no per-call limit, the limit is set around each call, and dynamo's global setting is unchanged after it."""
    import mmwf.engine.hooks.compile as compile_hook
    monkeypatch.setattr(compile_hook, 'PER_CALL_LIMIT', per_call and compile_hook.PER_CALL_LIMIT)
    model = Net()
    backbone, neck = Backend(None), Backend(None)
    torch._dynamo.reset()
    CompileHook(['backbone'], devices=('cpu',), backend=backbone, recompile_limit=2).before_run(runner_of(model))
    CompileHook(['neck'], devices=('cpu',), backend=neck, recompile_limit=2).before_run(runner_of(model))
    limit = torch._dynamo.config.recompile_limit
    with caplog.at_level(logging.INFO, 'test_compile_hook'), torch.no_grad():
        for shape in [(4, 8), (2, 4, 8), (2, 2, 4, 8), (2, 2, 2, 4, 8)]:
            model.backbone(torch.randn(shape))
        model.neck(torch.randn(4, 8))
    assert backbone.graphs == 2 and (neck.graphs == 1 or not per_call)
    assert torch._dynamo.config.recompile_limit == limit
    messages = [r.getMessage() for r in warnings_of(caplog, 'recompile limit')]
    assert len(messages) == 1, messages
    assert messages[0].startswith("CompileHook: backbone reached dynamo's recompile limit (2 graphs; ")
    assert 'Raise default_hooks.compile.recompile_limit' in messages[0]
    assert compiled(model.backbone)  # its graphs still run for the inputs they fit


def test_options_are_checked():
    with pytest.raises(ValueError, match='recompile_limit must be a positive int'):
        CompileHook(['backbone'], recompile_limit=0)
    with pytest.raises(ValueError, match="dynamic must be None, True or False"):
        CompileHook(['backbone'], dynamic='auto')


def _toy_run(work_dir, compile_hook=None, validate=True):
    """Four iterations of the toy model with a validation every two, ``linear`` compiled on the CPU by
    ``compile_hook``; its final weights and the run's log."""
    torch.manual_seed(0)
    runner = make_runner(
        work_dir, 4, model=ToyModel(), interval=4, hooks=dict(compile=compile_hook) if compile_hook else None,
        train_cfg=dict(by_epoch=False, max_iters=4, val_interval=2), val_cfg=dict(),
        val_dataloader=dict(dataset=ToyData(), sampler=dict(type='DefaultSampler', shuffle=False), batch_size=8,
                            num_workers=0, collate_fn=dict(type='default_collate')),
        val_evaluator=Evaluator([ToyMetric()]))
    torch._dynamo.reset()
    runner.train()
    log = ''.join(path.read_text() for path in work_dir.rglob('*.log'))
    return {k: v.clone() for k, v in runner.model.state_dict().items()}, log


@pytest.mark.parametrize('fails', ['train', 'eval'])
def test_a_run_goes_on_where_compiling_fails(fails, tmp_path):
    """A whole run (mmengine's Runner, the toy model): the compile fails at the first iteration or at the first
    validation; the run finishes with the weights of an eager run and one warning in its log file. With
    ``strict=True`` the same run stops with the compiler's error."""
    expected, _ = _toy_run(tmp_path / 'eager')
    hook = dict(type='CompileHook', modules=['linear'], devices=('cpu',), backend=Backend(fails))
    weights, log = _toy_run(tmp_path / 'compiled', hook)
    for key in expected:
        torch.testing.assert_close(weights[key], expected[key], rtol=0, atol=0)  # eager's kernels throughout
    assert log.count('CompileHook: compiling linear failed') == 1, log
    assert f'RuntimeError: lowering failed in {fails} (test backend)' in log
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=f'lowering failed in {fails}'):
        _toy_run(tmp_path / 'strict', dict(hook, backend=Backend(fails), strict=True))
