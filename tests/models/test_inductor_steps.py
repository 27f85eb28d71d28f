"""inductor, the compiler the configs run on CUDA, lowers each family's compiled part through CompileHook here with
its C++ backend on the CPU: the training step (forward and AOT autograd's backward) of WF-T (the ImageNet backbone),
of the Cascade's WF-T backbone and its simple feature pyramid, and of the WF-DiT denoiser, each from its config at
the smallest size, one block deep: a dynamic block (a static block differs by a plain depthwise convolution and
linear). The outputs and every gradient are eager's within float32's own error; a training step, a validation and a
training step again compile two graphs.

The configs' drop path and label dropout are off here: inductor draws its own random numbers, not eager's. inductor
runs as in a run, its caches on: a graph it has lowered before on this machine, unchanged (the same model code, torch
and settings), is loaded from its cache. Slow: a cold compile builds each kernel with the C++ compiler."""
import copy
import logging
from types import SimpleNamespace

import pytest
import torch
from mmengine.config import Config

import mmwf  # noqa: F401
from mmwf.engine.hooks import CompileHook
from mmwf.registry import MODELS

# compiled against float64: inductor fuses and reorders float32 sums (its own reduction order, GEMM and convolution
# calls), so its rounding error is of the order of eager float32's own; FACTOR bounds the ratio, ROUNDINGS covers a
# tensor eager happens to get exactly (measured: the ratio at most 1.13 for an output, 2.1 for a gradient)
FACTOR, ROUNDINGS = 8, 8


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def in1k():
    cfg = Config.fromfile('configs/imagenet/weightformer_t_in1k.py').model.backbone
    assert cfg.arch == 't' and cfg.drop_path_rate == 0.0
    cfg.update(arch=dict(embed_dims=192, depth=1, mlp_ratio=4), dynamic_blocks=[0])  # WF-T's widths
    parts = torch.nn.ModuleDict(dict(backbone=MODELS.build(cfg)))
    return parts, (torch.randn(2, 3, 64, 64),), lambda m, x: m['backbone'](x)


def cascade():
    cfg = Config.fromfile('configs/cascade_wf_t_coco.py').model
    assert cfg.backbone.arch == 't' and cfg.neck.type == 'SimpleFeaturePyramid'
    cfg.backbone.update(arch=dict(embed_dims=192, depth=1, mlp_ratio=4), dynamic_blocks=[0], out_indices=(0,),
                        drop_path_rate=0.0, init_cfg=None)
    parts = torch.nn.ModuleDict(dict(backbone=MODELS.build(cfg.backbone), neck=MODELS.build(cfg.neck)))
    return parts, (torch.randn(2, 3, 64, 64),), lambda m, x: m['neck'](m['backbone'](x))


def wf_dit():
    cfg = Config.fromfile('configs/generation/wf_dit_s_2_in256.py').model.denoiser
    assert cfg.type == 'WeightFormerDiT' and cfg.arch == 'S'
    cfg.update(arch=dict(hidden_size=384, depth=1), dynamic_blocks=[0], input_size=8,  # S's width
               class_dropout_prob=0.0)
    parts = torch.nn.ModuleDict(dict(denoiser=MODELS.build(cfg)))
    with torch.no_grad():  # DiT's zero init (adaLN-Zero, the last layer) would give zero outputs and gradients
        for p in parts.parameters():
            if not p.any():
                p.normal_(0, 0.02)
    # timesteps below 10: the sinusoidal embedding's phase t * f is float32 in both models (the float64 one too), so
    # at t near 1000 compiled's own exp / cos roundings of it (up to 1000 float32 roundings) would not show in eager
    # float32's error against float64
    return parts, (torch.randn(2, 4, 8, 8), torch.tensor([3, 7]), torch.tensor([3, 7])), \
        lambda m, x, t, y: m['denoiser'](x, t, y)


def outputs(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in outputs(o)]


def training_step(parts, call, inputs):
    """Outputs and every parameter's gradient of one training step (a squared loss of every output)."""
    parts.train()
    out = outputs(call(parts, *inputs))
    params = [p for p in parts.parameters() if p.requires_grad]
    grads = torch.autograd.grad(sum(o.square().mean() for o in out), params, allow_unused=True)
    return [o.detach() for o in out], list(grads)


def assert_within_float32_error(actual, expected, exact, name):
    """``actual`` (compiled, float32) is as close to ``exact`` (eager, float64) as ``FACTOR`` times eager float32's
    (``expected``) own error, plus ``ROUNDINGS`` float32 roundings of its largest magnitude."""
    assert (actual is None) == (expected is None), name
    if actual is None:
        return
    own = float((expected.double() - exact).abs().max())
    error = float((actual.double() - exact).abs().max())
    bound = FACTOR * own + ROUNDINGS * torch.finfo(torch.float32).eps * float(exact.abs().max())
    assert error <= bound, f'{name}: compiled differs from float64 by {error:.3g}, eager float32 by {own:.3g}'


def compare(parts, inputs, call, step=training_step):
    """Compile the parts with inductor as CompileHook does on CUDA (here on the CPU), run ``step`` compiled, eager
    in float32 and in float64, and compare; the compiled parts and their eager float32 twin."""
    eager = copy.deepcopy(parts)
    exact = copy.deepcopy(parts).double()
    runner = SimpleNamespace(model=parts, logger=logging.getLogger('test_inductor_steps'))
    CompileHook(list(parts), devices=('cpu',)).before_run(runner)
    expected, expected_grads = step(eager, call, inputs)
    exact_out, exact_grads = step(exact, call, [x.double() if x.is_floating_point() else x for x in inputs])
    out, grads = step(parts, call, inputs)
    assert all(part._compiled_call_impl is not None for part in parts.values())  # no fallback to eager
    names = [n for n, p in parts.named_parameters() if p.requires_grad]
    for i, (a, b, c) in enumerate(zip(out, expected, exact_out, strict=True)):
        assert_within_float32_error(a, b, c, f'output {i}')
    for name, a, b, c in zip(names, grads, expected_grads, exact_grads, strict=True):
        assert_within_float32_error(a, b, c, f'gradient of {name}')
    return parts, eager


@pytest.mark.slow
@pytest.mark.parametrize('family', [in1k, cascade], ids=['wf-t-in1k', 'cascade-wf-t+simple-pyramid'])
def test_inductor_compiles_the_training_step(family):
    compare(*family())


@pytest.mark.slow
def test_inductor_wf_dit_training_and_validation_graphs(caplog):
    """WF-DiT's training step, then a validation (eval mode, no gradients: the sampler's denoiser calls at two
    timesteps) and a training step again: two graphs, the training one and the validation one, far below the
    part's recompile limit, and the validation's outputs are eager's within float32's error too."""
    parts, inputs, call = wf_dit()
    graphs = torch._dynamo.utils.counters['stats']['unique_graphs']
    parts, eager = compare(parts, inputs, call)
    exact = copy.deepcopy(eager).double()
    for t in ([9, 9], [1, 5]):
        with torch.no_grad():
            x, y = inputs[0], inputs[2]
            args = (x, torch.tensor(t), y)
            out = call(parts.eval(), *args)
            assert_within_float32_error(out, call(eager.eval(), *args), call(exact.eval(), x.double(), *args[1:]),
                                        f'validation at t={t}')
    training_step(parts, call, inputs)
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] - graphs == 2
    assert 'recompile limit' not in caplog.text
