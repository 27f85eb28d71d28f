"""Table 1's predictors at value level: every dynamic linear (eqs. 4-8) and dynamic depthwise conv (eqs. 10-13)
against its equation in tests/reference.py (fp64, random inputs, a non-square grid whose sides 2 and 3 do not
divide), with the release's normalisations."""
import pytest
import torch

from mmwf.models.layers import (
    AdaptiveDynamicDWConv,
    AmpDirDynamicDWConv,
    BilateralDynamicLinear,
    ConvDynamicDWConv,
    DeepDynamicLinear,
    GAPDynamicDWConv,
    GAPDynamicLinear,
    LinearDynamicLinear,
    NonlinearDynamicLinear,
    evaluation,
)
from tests.reference import adaptive_pool, conv, dwconv_delta, linear_delta, linear_output, randomised, token_grid

HW = (5, 7)
CIN, COUT, B = 8, 16, 2


















LINEARS = {
    'GAP (4)': lambda: GAPDynamicLinear(CIN, COUT, hidden=6),
    'Linear w/o pool (5)': lambda: LinearDynamicLinear(CIN, COUT, pool=False),
    'Linear w/ pool (5), token order': lambda: LinearDynamicLinear(CIN, COUT, order='tokens'),
    'Linear w/ pool (5), core order': lambda: LinearDynamicLinear(CIN, COUT, order='core'),
    'Nonlinear (6)': lambda: NonlinearDynamicLinear(CIN, COUT, order='tokens'),
    'Deep (7), token order': lambda: DeepDynamicLinear(CIN, COUT, order='tokens'),
    'Deep (7), core order': lambda: DeepDynamicLinear(CIN, COUT, order='core'),
    'Bilateral (8), token order': lambda: BilateralDynamicLinear(CIN, COUT, order='tokens'),
    'Bilateral (8), core order': lambda: BilateralDynamicLinear(CIN, COUT, order='core'),
}


# every evaluation a dynamic linear has (the layers' choices, mmwf.models.layers.implementation.CHOICES): the update
# applied as its rank-K factors (eager) or through a weight per sample (the FLOP counter's and the ONNX graphs'),
# added by one addcdiv or by a division and an add (the TorchScript exporter's), Deep's outer product either way
EVALUATIONS = {'factored': dict(form='factored'), 'materialized, addcdiv': dict(form='materialized', update='addcdiv'),
               'materialized, div-add': dict(form='materialized', update='div-add'),
               'outer left': dict(outer='left', update='div-add'), 'outer right': dict(outer='right')}


@pytest.fixture(params=EVALUATIONS.values(), ids=EVALUATIONS.keys())
def weight_form(request):
    """One of :data:`EVALUATIONS`, set on a layer with ``evaluation(layer, **choices)``."""
    return request.param




@pytest.mark.parametrize('make', LINEARS.values(), ids=LINEARS.keys())
def test_dynamic_linear_equals_its_equation(make, weight_form):
    """Outputs and the gradients of the input and of every parameter, against autograd through the equation."""
    layer = randomised(make().double())
    x = torch.randn(B, HW[0] * HW[1], CIN, dtype=torch.float64, requires_grad=True)
    with evaluation(layer, **weight_form):
        out = layer(x, HW)
    expected = linear_output(layer, x, linear_delta(layer, x, HW))
    assert torch.allclose(out, expected, rtol=1e-10, atol=1e-10)
    weights = torch.randn_like(out)  # a loss that weighs every output differently
    inputs = (x, *layer.parameters())
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    ref_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    assert all(torch.allclose(g, r, rtol=1e-9, atol=1e-9) for g, r in zip(grads, ref_grads))


@pytest.mark.parametrize('kind', [BilateralDynamicLinear, LinearDynamicLinear])
def test_second_linear_predicts_from_the_mlp_input(kind, weight_form):
    """Dynamic Linear 2 with a context: dW (4C x C) predicted from the C-wide MLP input, applied to the hidden."""
    layer = randomised(kind(4 * CIN, CIN, context_features=CIN).double())
    hidden = torch.randn(B, HW[0] * HW[1], 4 * CIN, dtype=torch.float64)
    context = torch.randn(B, HW[0] * HW[1], CIN, dtype=torch.float64)
    expected = linear_output(layer, hidden, linear_delta(layer, context, HW))
    with evaluation(layer, **weight_form):
        assert torch.allclose(layer(hidden, HW, context), expected, rtol=1e-10, atol=1e-10)


def test_factored_update_of_a_zero_column_has_no_nan_gradient(weight_form):
    """A column of dW that is exactly zero (its norm's derivative undefined at 0): the gradients stay finite in both
    evaluations, as the release's ``torch.norm`` gives (zero subgradient)."""
    layer = randomised(BilateralDynamicLinear(CIN, COUT).double())
    with torch.no_grad():
        layer.w2[:, 3] = 0  # dW's column 3 is zero: (SiLU(B) w2)[:, 3] = 0
    x = torch.randn(B, HW[0] * HW[1], CIN, dtype=torch.float64, requires_grad=True)
    with evaluation(layer, **weight_form):
        grads = torch.autograd.grad(layer(x, HW).square().sum(), (x, *layer.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)


def test_factored_update_keeps_its_column_norms_in_fp32_under_fp16_autocast():
    """Small column norms of dW, whose squares underflow to 0 in fp16 (where the square root's derivative is
    infinite: every gradient of WF-T's fp16 training step on CUDA was NaN): under fp16 autocast the factored update
    has finite gradients that agree with fp32's to fp16's rounding."""
    layer = BilateralDynamicLinear(CIN, COUT)
    x = torch.randn(B, HW[0] * HW[1], CIN, requires_grad=True)
    left = torch.randn(1, CIN, 4) * 1e-2
    right = (torch.randn(B, 4, COUT) * 1e-3).requires_grad_()
    gram = left.transpose(1, 2) @ left
    half = right.detach().half()
    assert ((half * (gram.half() @ half)).sum(1) == 0).any()  # the squares do underflow in fp16

    def grads(dtype):
        with torch.autocast('cpu', dtype=dtype or torch.float32, enabled=dtype is not None):
            # the factors as autocast's matrix products return them: in fp16
            cast = (lambda t: t.to(dtype)) if dtype else (lambda t: t)
            out = layer.apply_factors(x, cast(left), cast(right), cast(gram))
        return torch.autograd.grad(out.float().square().sum(), (x, right, layer.w, layer.b))
    reference, mixed = grads(None), grads(torch.float16)
    u = torch.finfo(torch.float16).eps / 2
    for g, r in zip(mixed, reference):
        assert torch.isfinite(g).all()
        assert (g - r).norm() < 12 * u * r.norm()


def test_gram_column_norms_are_those_of_dw_in_fp32_under_fp16_autocast():
    """From fp16 factors whose fp16 squares underflow (the old fp16 evaluation gave every norm 0): the norms in fp32,
    within fp16's rounding of the factors, and a zero column's norm 0 with gradient 0."""
    from mmwf.models.layers.dynamic_linear import gram_column_norms
    left, right = torch.randn(1, CIN, 4) * 1e-2, torch.randn(B, 4, COUT) * 1e-3
    gram = left.transpose(1, 2) @ left
    expected = torch.linalg.vector_norm(left.double() @ right.double(), dim=1, keepdim=True)
    with torch.autocast('cpu', dtype=torch.float16):
        norms = gram_column_norms(gram.half(), right.half())
    assert norms.dtype == torch.float32
    assert torch.allclose(norms.double(), expected, rtol=8 * torch.finfo(torch.float16).eps / 2)
    right = right.clone()
    right[:, :, 3] = 0
    right.requires_grad_()
    (grad,) = torch.autograd.grad(gram_column_norms(gram, right).sum(), right)
    assert torch.isfinite(grad).all() and (grad[:, :, 3] == 0).all()






DWCS = {
    'GAP (10)': GAPDynamicDWConv, 'Adaptive (11)': AdaptiveDynamicDWConv, 'Amp-Dir (12)': AmpDirDynamicDWConv,
    'Conv (13)': ConvDynamicDWConv,
}


@pytest.mark.parametrize('choices', [dict(conv='loop', pool='native'), dict(conv='grouped', pool='matrices'),
                                     dict(conv='taps', pool='native'), dict(conv='shift', pool='matrices'),
                                     dict(conv='grouped', pool='tokens'), dict(conv='shift', pool='tokens')],
                         ids=lambda c: f'{c["conv"]}, {c["pool"]} pooling')
@pytest.mark.parametrize('kind', DWCS.values(), ids=DWCS.keys())
def test_dynamic_dwconv_equals_its_equation(kind, choices):
    """Outputs and gradients of every evaluation (the layer's choices ``conv`` and ``pool``)."""
    layer = randomised(kind(CIN, **choices).double())
    x = torch.randn(B, HW[0] * HW[1], CIN, dtype=torch.float64, requires_grad=True)
    m = token_grid(x, HW).permute(0, 3, 1, 2)  # (B, C, H, W)
    weight = layer.w[None, :, 0] + dwconv_delta(layer, m)  # (B, C, K, K): W0 + dW per sample
    expected = torch.cat([conv(m[i:i + 1], weight[i][:, None], layer.b, groups=CIN) for i in range(B)])
    expected = expected.permute(0, 2, 3, 1).reshape(B, -1, CIN)
    out = layer(x, HW)
    assert torch.allclose(out, expected, rtol=1e-10, atol=1e-10)
    weights, inputs = torch.randn_like(out), (x, *layer.parameters())
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    ref_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    assert all(torch.allclose(g, r, rtol=1e-9, atol=1e-9) for g, r in zip(grads, ref_grads))
    with torch.no_grad():  # inference: the grouped conv adds the bias as it writes the tokens' layout
        assert torch.allclose(layer(x, HW), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('impl', ['loop', 'grouped', 'taps', 'shift'])
def test_per_sample_depthwise_conv_paths_equal_the_convolution(impl):
    """The four evaluations of one per-sample depthwise conv (eager CPU, eager CUDA, exported with a dynamic batch,
    compiled): outputs and gradients against the shift-sum written out above, fp64, on a non-square grid."""
    from mmwf.models.layers.dynamic_dwconv import per_sample_depthwise_conv
    x = torch.randn(3, 5, 7, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    out = per_sample_depthwise_conv(x, w, b, impl=impl)
    ref = torch.cat([conv(x[i:i + 1], w[i][:, None], b, groups=5) for i in range(3)])
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(out.square().sum(), (x, w, b))
    ref_grads = torch.autograd.grad(ref.square().sum(), (x, w, b))
    assert all(torch.allclose(g, r, rtol=1e-10, atol=1e-10) for g, r in zip(grads, ref_grads))


def test_pooling_matrices_equal_adaptive_average_pooling_on_every_grid():
    """The exportable form of the 3 x 3 adaptive pooling (eq. 11-13): PyTorch's bins for every side 1..24."""
    import torch.nn.functional as F

    from mmwf.models.layers.dynamic_dwconv import pooling_matrices
    for h in range(1, 25):
        for w in (1, 2, 3, 5, 7, 13, 24):
            x = torch.randn(2, 4, h, w, dtype=torch.float64)
            assert torch.allclose(pooling_matrices(x, 3), F.adaptive_avg_pool2d(x, 3), rtol=1e-12, atol=1e-12), (h, w)
            assert torch.allclose(pooling_matrices(x, 3), adaptive_pool(x, 3), rtol=1e-12, atol=1e-12)


def test_pooling_over_the_tokens_equals_adaptive_average_pooling_on_every_grid():
    """One product over the tokens (eager CUDA, compiled): the reference's bins for every side 1..24, eager (the
    matrix built once per grid) and in a graph (built there, generic in the grid)."""
    from mmwf.models.layers.dynamic_dwconv import adaptive_avg_pool, pool_tokens_adaptive
    for h in range(1, 25):
        for w in (1, 2, 5, 13, 24):
            x = torch.randn(2, h * w, 4, dtype=torch.float64)
            m = token_grid(x, (h, w)).permute(0, 3, 1, 2)
            expected = adaptive_pool(m, 3)
            assert torch.allclose(adaptive_avg_pool(m, 3, 'tokens'), expected, rtol=1e-12, atol=1e-12), (h, w)
            assert torch.allclose(pool_tokens_adaptive(x, (h, w), 3),
                                  expected.flatten(2).transpose(1, 2), rtol=1e-12, atol=1e-12)
    x = torch.randn(2, 11 * 3, 4, dtype=torch.float32)
    with torch.inference_mode():  # the matrix first built at inference serves training too
        pool_tokens_adaptive(x, (11, 3), 3)
    (grad,) = torch.autograd.grad(pool_tokens_adaptive(x.requires_grad_(), (11, 3), 3).sum(), x)
    assert torch.allclose(grad.sum(1), torch.full((2, 4), 9.0))  # each of the 9 bins averages to weights summing to 1
    compiled = torch.compile(pool_tokens_adaptive, backend='eager', dynamic=True, fullgraph=True)
    for h, w in ((7, 9), (11, 4)):
        x = torch.randn(2, h * w, 4, dtype=torch.float64)
        expected = adaptive_pool(token_grid(x, (h, w)).permute(0, 3, 1, 2), 3).flatten(2).transpose(1, 2)
        assert torch.allclose(compiled(x, (h, w), 3), expected, rtol=1e-12, atol=1e-12), (h, w)


def test_pooling_over_the_tokens_in_bf16_is_unbiased():
    """In bf16 (tokens or autocast) the bins are summed by a 0/1 mask and divided in fp32: each bin within two
    roundings of bf16 of the exact mean (of the rounded tokens), and no bias common to the bins (1 / 26 rounded to
    bf16 is 0.3 % off, which a product with the rounded averaging matrix adds to every bin of a 78 x 78 grid)."""
    from mmwf.models.layers.dynamic_dwconv import pool_tokens_adaptive
    x = (1 + torch.rand(4, 78 * 78, 64)).bfloat16()  # positive: no cancellation in the means
    exact = adaptive_pool(token_grid(x.double(), (78, 78)).permute(0, 3, 1, 2), 3).flatten(2).transpose(1, 2)
    u = torch.finfo(torch.bfloat16).eps / 2
    for dtype, autocast in ((torch.bfloat16, False), (torch.float32, True)):
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            pooled = pool_tokens_adaptive(x.to(dtype), (78, 78), 3).double()
        relative = (pooled - exact) / exact
        assert relative.abs().max() <= 2 * u, dtype
        assert relative.mean().abs() <= u / 8, dtype


def test_pooling_matrices_are_kept_for_plain_tensors_only():
    """A first call on fake tensors (shape propagation) keeps nothing: a later call on real ones computes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mmwf.models.layers.dynamic_dwconv import pool_tokens_adaptive
    with FakeTensorMode():
        assert pool_tokens_adaptive(torch.randn(2, 7 * 9, 4, dtype=torch.float64), (7, 9), 3).shape == (2, 9, 4)
    x = torch.randn(2, 7 * 9, 4, dtype=torch.float64)
    expected = adaptive_pool(token_grid(x, (7, 9)).permute(0, 3, 1, 2), 3).flatten(2).transpose(1, 2)
    assert torch.allclose(pool_tokens_adaptive(x, (7, 9), 3), expected, rtol=1e-12, atol=1e-12)


def test_a_tap_conv_is_the_release_1x1_conv_on_the_taps():
    """:class:`TapConv` on taps (B, K*K, C) equals the 1 x 1 conv on the (B, C, K, K) kernel, with the conv's keys."""
    from mmwf.models.layers.dynamic_dwconv import TapConv
    layer = randomised(TapConv(6, 5).double())
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == {'weight': (5, 6, 1, 1), 'bias': (5,)}
    kernel = torch.randn(2, 6, 3, 3, dtype=torch.float64)
    expected = conv(kernel, layer.weight, layer.bias).flatten(2).transpose(1, 2)
    assert torch.allclose(layer(kernel.flatten(2).transpose(1, 2)), expected, rtol=1e-12, atol=1e-12)
