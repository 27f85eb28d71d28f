"""Every family compiles as one graph: dynamo captures each forward whole (``fullgraph=True``: no graph break, so no
host synchronisation such as ``.item()`` and no branch on a tensor's value), in inference and in training (with
AOT autograd's backward), and a change of image size recompiles once, to one graph generic in the sizes."""
import logging
from types import SimpleNamespace

import pytest
import torch

import mmwf  # noqa: F401
from mmwf.engine.hooks import CompileHook
from mmwf.models.backbones import DeiT, WeightFormer
from mmwf.models.diffusion import DiT, WeightFormerDiT
from mmwf.models.layers import OPERATORS
from mmwf.models.necks import SimpleFeaturePyramid, ViTBaselinePyramid

TINY_WF = dict(embed_dims=32, depth=3, mlp_ratio=2)
TINY_DEIT = dict(embed_dims=32, depth=2, num_heads=2, mlp_ratio=2)


class Pyramid(torch.nn.Module):
    """A plain backbone and its neck, as the dense configs run them."""

    def __init__(self, backbone: torch.nn.Module, neck: torch.nn.Module) -> None:
        super().__init__()
        self.backbone, self.neck = backbone, neck

    def forward(self, x):
        return self.neck(self.backbone(x))


class Denoiser(torch.nn.Module):
    """A diffusion transformer on (latents, timesteps, labels) of a fixed draw."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        batch = x.shape[0]
        return self.model(x, torch.arange(batch) * 100, torch.arange(batch) % 5)


FAMILIES = {
    'weightformer': (lambda: WeightFormer(TINY_WF, dynamic_blocks=[1]), (2, 3, 64, 80)),
    'weightformer-classifier': (lambda: WeightFormer(TINY_WF, dynamic_blocks=[1], num_classes=5, out_type='timm'),
                                (2, 3, 64, 64)),
    **{f'deit-{op}': (lambda cls=cls: DeiT(TINY_DEIT, attn_cfg=dict(type=cls.__name__)), (2, 3, 64, 80))
       for op, cls in OPERATORS.items()},
    'weightformer+simple-pyramid': (lambda: Pyramid(WeightFormer(TINY_WF, dynamic_blocks=[1]),
                                                    SimpleFeaturePyramid(32, 16)), (2, 3, 64, 80)),
    'deit+simple-pyramid': (lambda: Pyramid(DeiT(TINY_DEIT, with_cls_token=False), SimpleFeaturePyramid(32, 16)),
                            (2, 3, 64, 80)),
    'weightformer+baseline-pyramid': (lambda: Pyramid(WeightFormer(dict(TINY_WF, depth=4), dynamic_blocks=[1],
                                                                   out_indices=(0, 1, 2, 3)),
                                                      ViTBaselinePyramid(32, num_groups=4)), (2, 3, 64, 80)),
    'wf-dit': (lambda: Denoiser(WeightFormerDiT(dict(hidden_size=32, depth=3), input_size=8, num_classes=5)),
               (2, 4, 8, 8)),
    'dit': (lambda: Denoiser(DiT(dict(hidden_size=32, depth=2, num_heads=2), input_size=8, num_classes=5)),
            (2, 4, 8, 8)),
}


class GraphCounter:
    """A dynamo backend that counts the graphs it is given and hands each to ``backend`` (a dynamo backend), or runs
    it as traced (eager kernels)."""

    def __init__(self, backend=None) -> None:
        self.graphs, self.backend = 0, backend

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward if self.backend is None else self.backend(gm, example_inputs)


def outputs(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in outputs(o)]


@pytest.mark.parametrize('training', [False, pytest.param(True, marks=pytest.mark.slow)], ids=['inference', 'training'])
@pytest.mark.parametrize('family', FAMILIES, ids=FAMILIES)
def test_every_family_compiles_as_one_graph(family, training):
    """One graph and no break for the forward; in training AOT autograd traces the backward too, and the outputs
    and every parameter's gradient equal eager's to float32 rounding over a few layers (the graph runs the same
    kernels, so only reassociation can differ)."""
    from torch._dynamo.backends.registry import lookup_backend
    torch._dynamo.reset()
    build, shape = FAMILIES[family]
    model = build().train(training)
    x = torch.randn(shape)
    if not training:
        counter = GraphCounter()
        with torch.no_grad():
            torch.compile(model, backend=counter, fullgraph=True)(x)
        assert counter.graphs == 1
        return
    torch.manual_seed(1)  # the same draws (label dropout, drop path) in both runs
    eager = outputs(model(x))
    parameters = [p for p in model.parameters() if p.requires_grad]  # not DiT's fixed positions
    eager_grads = torch.autograd.grad(sum(o.square().mean() for o in eager), parameters, allow_unused=True)
    torch.manual_seed(1)
    counter = GraphCounter(lookup_backend('aot_eager'))  # one trace: counted, then AOT autograd's
    compiled = outputs(torch.compile(model, backend=counter, fullgraph=True)(x))
    assert counter.graphs == 1
    grads = torch.autograd.grad(sum(o.square().mean() for o in compiled), parameters, allow_unused=True)
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    for a, b in zip(eager_grads, grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize('family,most', [('deit+simple-pyramid', 2), ('weightformer+simple-pyramid', 4)])
def test_image_sizes_recompile_a_bounded_number_of_times(family, most):
    """Six image sizes (a config's training and testing sizes, a multi-scale run's): the first compiles for its size,
    the second once more with dynamic sizes, which the others run; a dynamic linear's cost rule (tokens' or core's
    order, factored or materialized) adds a graph where its choice changes, two at most for WF-T's one dynamic
    linear, well below dynamo's limit, past which it would run eager. The denoisers are built for one latent size."""
    torch._dynamo.reset()
    build, shape = FAMILIES[family]
    model = torch.compile(build().eval(), backend=(counter := GraphCounter()), fullgraph=True)
    with torch.no_grad():  # no pyramid level of side 1 (dynamo specialises sizes 0 and 1)
        for i, side in enumerate([(128, 160), (160, 128), (192, 192), (256, 320), (512, 384), (640, 640)]):
            model(torch.randn(*shape[:2], *side))
            if i == 1:
                assert counter.graphs == 2
    assert 2 <= counter.graphs <= most < torch._dynamo.config.recompile_limit


@pytest.mark.slow
def test_a_multi_scale_train_then_validation_cycle_stays_within_the_hooks_limit(caplog):
    """CompileHook's parts over a multi-scale detection cycle: training at three image sizes and a batch of one, then
    validation at three sizes and batches of one and two. Each part's graphs (training's and validation's: grad mode
    and eval mode are guarded, so validation compiles its own) stay within the hook's ``recompile_limit`` (16),
    without its warning. Measured (torch 2.14, CPU): the backbone 4 training graphs (one where the dynamic linear's
    cost rule switches) + 3 validation graphs, the pyramid 3 + 4 (its convolutions' layout rule switches with the
    size); with more sizes the pyramid reaches dynamo's global limit of 8 (3 + 5 at six validation sizes), hence the
    hook's own limit, per part."""
    torch._dynamo.reset()
    build, _ = FAMILIES['weightformer+simple-pyramid']
    model = build()
    counters = {'backbone': GraphCounter(), 'neck': GraphCounter()}
    runner = SimpleNamespace(model=model, logger=logging.getLogger('test_compile'))
    for part, counter in counters.items():
        CompileHook([part], devices=('cpu',), backend=counter).before_run(runner)
    with caplog.at_level(logging.INFO, 'test_compile'):
        model.train()
        for batch, *size in [(2, 128, 160), (2, 160, 128), (2, 256, 320), (1, 128, 160)]:
            sum(o.square().mean() for o in model(torch.randn(batch, 3, *size))).backward()
        trained = {part: counter.graphs for part, counter in counters.items()}
        model.eval()
        with torch.no_grad():
            for batch, *size in [(1, 128, 160), (1, 256, 320), (2, 192, 192), (1, 640, 640)]:
                model(torch.randn(batch, 3, *size))
    graphs = {part: counter.graphs for part, counter in counters.items()}
    assert all(trained[part] < graphs[part] <= 16 for part in graphs), (trained, graphs)
    assert 'recompile limit' not in caplog.text
