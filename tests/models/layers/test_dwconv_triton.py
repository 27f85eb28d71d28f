"""The per-sample depthwise conv's Triton kernels (forward, the input's and the taps' gradients) against the plain
convolution of the paper's eq. 9, on odd shapes: C not a power of two nor a multiple of the channel block, H != W,
batch 1 and 3, grids smaller than the token block, K 3 and 5, taps shared by the batch, a grid whose taps' gradient
is summed over two chunks of tokens. They run on the GPU where there is one, else on the CPU under Triton's interpreter
(tests/triton_device.py); ``tests/test_cuda.py`` runs them at the layers' sizes on the device."""
import pytest
import torch

from mmwf.models.layers import AdaptiveDynamicDWConv
from mmwf.models.layers.dwconv_triton import per_sample_dwconv_triton
from mmwf.models.layers.implementation import evaluation
from tests.reference import conv, randomised
from tests.triton_device import TRITON_DEVICE

SHAPES = [(3, 5, 7, 6, 3), (1, 4, 9, 70, 3), (3, 2, 3, 5, 5), (2, 9, 6, 130, 3), (1, 13, 11, 20, 3)]  # B, H, W, C, K


def reference(x, hw, taps, bias):
    """Eq. 9 per sample: the depthwise convolution of the map with that sample's kernel (tests.reference.conv, no
    torch.nn.functional), as tokens, on the CPU (differentiable back to the operands' device)."""
    x, taps, bias = (None if t is None else t.cpu() for t in (x, taps, bias))
    B, C, k = x.shape[0], x.shape[2], round(taps.shape[1] ** 0.5)
    m = x.transpose(1, 2).reshape(B, C, *hw)
    kernels = taps.expand(B, -1, -1).transpose(1, 2).reshape(B, C, 1, k, k)
    out = torch.cat([conv(m[i:i + 1], kernels[i], bias, groups=C) for i in range(B)])
    return out.flatten(2).transpose(1, 2)


@pytest.mark.parametrize('shared', [False, True], ids=['per-sample', 'shared'])
@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'B{}-{}x{}-C{}-K{}'.format(*s))
def test_kernels_equal_the_convolution_in_fp64(shape, shared):
    B, H, W, C, K = shape
    x = torch.randn(B, H * W, C, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    taps = torch.randn(1 if shared else B, K * K, C, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    bias = torch.randn(C, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    out, expected = per_sample_dwconv_triton(x, (H, W), taps, bias), reference(x, (H, W), taps, bias)
    assert out.device == TRITON_DEVICE
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn(out.shape, dtype=out.dtype)
    grads = torch.autograd.grad((out.cpu() * weights).sum(), (x, taps, bias))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (x, taps, bias))
    for g, r in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_kernels_in_low_precision_sum_in_fp32(dtype):
    """fp32 and bf16 tokens: the sums in fp32, one rounding to the dtype at the store. Against fp64 on the rounded
    inputs, the error is at most K*K + 1 fp32 roundings (each product and each addition) of the sum of the terms'
    magnitudes, plus the store's conversion to the dtype: one ulp (Triton's interpreter converts fp32 to bf16 toward
    zero, checked here; a GPU rounds to nearest, half an ulp). A GPU contracts each product and addition into one FMA,
    one rounding where the bound counts two."""
    B, H, W, C, K = 2, 7, 5, 40, 3
    x64, taps64 = torch.randn(B, H * W, C, dtype=torch.float64), torch.randn(B, K * K, C, dtype=torch.float64)
    x, taps = x64.to(dtype), taps64.to(dtype)
    out = per_sample_dwconv_triton(x.to(TRITON_DEVICE), (H, W), taps.to(TRITON_DEVICE)).cpu()
    assert out.dtype == dtype
    exact = reference(x.double(), (H, W), taps.double(), None)  # the rounded inputs, exactly
    scale = reference(x.double().abs(), (H, W), taps.double().abs(), None)
    u32, ulp = torch.finfo(torch.float32).eps / 2, torch.finfo(dtype).eps
    bound = ((K * K + 1) * u32 + ulp) * scale
    assert ((out.double() - exact).abs() <= bound).all()
    assert (out.double() - exact).abs().max() > 0  # the bound is met by rounding, not by an fp64 evaluation


def test_the_layer_takes_the_kernel_as_its_conv_choice():
    """AdaptiveDynamicDWConv with conv='triton' gives what its reference evaluation gives, outputs and gradients."""
    layer = randomised(AdaptiveDynamicDWConv(12).double()).to(TRITON_DEVICE)
    x = torch.randn(2, 6 * 5, 12, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    outs = []
    for choice in ('triton', 'shift'):
        with evaluation(layer, conv=choice):
            out = layer(x, (6, 5))
        outs.append((out, torch.autograd.grad(out.square().sum(), (x, *layer.parameters()))))
    (a, ga), (b, gb) = outs
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for g, r in zip(ga, gb, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_compiled_graphs_call_the_operator_without_a_break():
    x, taps = torch.randn(2, 12, 8, device=TRITON_DEVICE), torch.randn(2, 9, 8, device=TRITON_DEVICE)
    compiled = torch.compile(lambda x, t: per_sample_dwconv_triton(x, (3, 4), t) * 2, backend='aot_eager',
                             fullgraph=True)
    torch.testing.assert_close(compiled(x, taps), per_sample_dwconv_triton(x, (3, 4), taps) * 2)


def test_shapes_that_do_not_fit_are_named():
    x, taps = torch.randn(2, 12, 8, device=TRITON_DEVICE), torch.randn(2, 9, 8, device=TRITON_DEVICE)
    with pytest.raises(ValueError, match=r'tokens \(2, 12, 8\) on grid \(3, 5\)'):
        per_sample_dwconv_triton(x, (3, 5), taps)
    with pytest.raises(ValueError, match=r'bias \(7,\) is not \(8,\)'):
        per_sample_dwconv_triton(x, (3, 4), taps, torch.randn(7, device=TRITON_DEVICE))


def test_second_derivatives_equal_the_convolution():
    """The taps' gradient is itself differentiable (a second derivative of a layer: gradient penalties, double
    backward): against eq. 9's in fp64."""
    B, H, W, C, K = 2, 5, 4, 6, 3
    x = torch.randn(B, H * W, C, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    taps = torch.randn(B, K * K, C, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    results = []
    for conv_fn in (per_sample_dwconv_triton, reference):
        args = (x, (H, W), taps) if conv_fn is per_sample_dwconv_triton else (x, (H, W), taps, None)
        gx, gt = torch.autograd.grad(conv_fn(*args).square().sum(), (x, taps), create_graph=True)
        results.append(torch.autograd.grad(gx.square().sum() + gt.square().sum(), (x, taps)))
    for g, r in zip(*results, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


def test_bias_gradient_keeps_the_bias_dtype():
    """bf16 tokens with an fp32 bias (a layer's parameters under autocast): the bias's gradient summed in fp32 and
    kept in fp32: exact here, where bf16 would round (36 x (1 + 2^-7) = 36.28125 needs 11 significant bits)."""
    x = torch.zeros(3, 12, 8, dtype=torch.bfloat16, device=TRITON_DEVICE, requires_grad=True)
    bias = torch.zeros(8, device=TRITON_DEVICE, requires_grad=True)
    out = per_sample_dwconv_triton(x, (3, 4), torch.zeros(3, 9, 8, dtype=torch.bfloat16, device=TRITON_DEVICE), bias)
    grad = torch.full_like(out, 1 + 2 ** -7)  # a bf16 number
    (bias_grad,) = torch.autograd.grad(out, bias, grad)
    assert bias_grad.dtype == torch.float32 and (bias_grad == 36.28125).all()


def test_empty_batches_pass_through():
    x = torch.randn(0, 12, 8, device=TRITON_DEVICE, requires_grad=True)
    taps = torch.randn(0, 9, 8, device=TRITON_DEVICE, requires_grad=True)
    out = per_sample_dwconv_triton(x, (3, 4), taps)
    assert out.shape == (0, 12, 8)
    assert all(g.shape == t.shape for g, t in zip(torch.autograd.grad(out.sum(), (x, taps)), (x, taps)))


def test_the_operators_pass_torch_library_opcheck():
    """The schema, the fake (meta) implementations against the real outputs' shapes and strides (also for tokens
    given as a transposed view), the autograd registration and AOT dispatch with dynamic shapes."""
    from mmwf.models.layers import dwconv_triton  # noqa: F401  (registers the operators)
    x = torch.randn(2, 6, 15, device=TRITON_DEVICE).transpose(1, 2).requires_grad_()  # (2, 15, 6), not contiguous
    taps = torch.randn(2, 9, 6, device=TRITON_DEVICE, requires_grad=True)
    bias = torch.randn(6, device=TRITON_DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.mmwf.per_sample_dwconv.default, (x, 3, 5, taps, bias, False))
    torch.library.opcheck(torch.ops.mmwf.per_sample_dwconv_taps_grad.default,
                          (x, 3, 5, torch.randn(2, 15, 6, device=TRITON_DEVICE, requires_grad=True), 3))


@pytest.mark.parametrize('shared', [False, True], ids=['per-sample', 'shared'])
def test_the_shortcut_in_the_kernel_equals_adding_the_tokens(shared):
    """residual=True (x + conv(x): the centre tap plus one) against eq. 9 plus the tokens, outputs and gradients, in
    fp64; in bf16 the taps stay in fp32 for the fold, so the error bound is the convolution's own."""
    B, H, W, C, K = 3, 5, 7, 10, 3
    x = torch.randn(B, H * W, C, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    taps = torch.randn(1 if shared else B, K * K, C, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    bias = torch.randn(C, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    out = per_sample_dwconv_triton(x, (H, W), taps, bias, residual=True).cpu()
    expected = reference(x, (H, W), taps, bias) + x.cpu()
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(out)
    for g, r in zip(torch.autograd.grad((out * weights).sum(), (x, taps, bias)),
                    torch.autograd.grad((expected * weights).sum(), (x, taps, bias)), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    xb, tb = x.detach().bfloat16(), taps.detach().bfloat16()
    low = per_sample_dwconv_triton(xb, (H, W), tb, residual=True).cpu().double()
    xb, tb = xb.cpu(), tb.cpu()
    exact = reference(xb.double(), (H, W), tb.double(), None) + xb.double()
    scale = reference(xb.double().abs(), (H, W), tb.double().abs(), None) + xb.double().abs()
    u32, ulp = torch.finfo(torch.float32).eps / 2, torch.finfo(torch.bfloat16).eps
    assert ((low - exact).abs() <= ((K * K + 2) * u32 + ulp) * scale).all()


def test_static_convs_take_the_kernel_with_their_one_weight():
    """StaticDWConv with conv='triton': the kernel with its weight shared by the batch (a zero batch stride), with
    and without the shortcut, equals nn.Conv2d's, outputs and gradients."""
    from mmwf.models.layers import StaticDWConv
    layer = randomised(StaticDWConv(12).double()).to(TRITON_DEVICE)
    x = torch.randn(2, 6 * 5, 12, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    for residual in (False, True):
        outs = []
        for choice in ('triton', 'auto'):
            with evaluation(layer, conv=choice):
                out = layer(x, (6, 5), residual=residual)
            outs.append((out, torch.autograd.grad(out.square().sum(), (x, *layer.parameters()))))
        (a, ga), (b, gb) = outs
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        for g, r in zip(ga, gb, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
