"""The factored dynamic linear's Triton kernel (``layers/dynamic_linear_triton.py``) against the paper's equations, on
odd shapes: Cin, Cout and the rank neither powers of two nor multiples of the blocks, batch 1 and 3, fewer tokens
than a block, left factors per sample and shared, with and without the GELU epilogue; forward and backward. It runs on
the GPU where there is one, else on the CPU under Triton's interpreter (tests/triton_device.py); ``tests/test_cuda.py``
runs it at the layers' sizes on the device."""
import pytest
import torch
import torch.nn.functional as F

from mmwf.models.backbones import WeightFormer
from mmwf.models.layers import BilateralDynamicLinear
from mmwf.models.layers.dynamic_linear_triton import low_rank_linear_triton
from mmwf.models.layers.implementation import evaluation
from tests.reference import gelu, linear_delta, linear_output, randomised
from tests.triton_device import TENSOR_CORE_ROUNDINGS, TRITON_DEVICE, fp32_sums_in_cublas, full_fp32

SHAPES = [(3, 35, 24, 5, 40), (1, 70, 48, 12, 96), (2, 7, 20, 49, 13), (3, 130, 70, 33, 65)]  # B, N, Cin, K, Cout


def reference(x, weight, bias, left, right, act):
    """act(x (W0 + L R) + b), the update formed per sample, in einsums (no matmul of the kernel's order)."""
    dw = torch.einsum('bik,bko->bio', left.expand(x.shape[0], -1, -1), right.expand(x.shape[0], -1, -1))
    z = torch.einsum('bni,bio->bno', x, weight + dw) + bias
    return gelu(z) if act else z


def operands(shape, shared, dtype=torch.float64, requires_grad=True, device=TRITON_DEVICE):
    """x, W0, b, L, R of ``shape`` on ``device`` (the kernel's); ``shared``: which factors one sample's are for the
    batch (False, 'left', 'right' or 'both'; True: 'left')."""
    B, N, cin, k, cout = shape
    shared = 'left' if shared is True else shared or ''
    left_b, right_b = (1 if shared in (side, 'both') else B for side in ('left', 'right'))
    return [torch.randn(*s, dtype=dtype, device=device, requires_grad=requires_grad)
            for s in ((B, N, cin), (cin, cout), (cout,), (left_b, cin, k), (right_b, k, cout))]


@pytest.mark.parametrize('act', [False, True], ids=['linear', 'gelu'])
@pytest.mark.parametrize('shared', [False, 'left', 'right', 'both'], ids=['per-sample', 'left', 'right', 'both'])
@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'B{}-N{}-{}x{}x{}'.format(*s))
def test_kernel_equals_the_equation_in_fp64(shape, shared, act):
    inputs = operands(shape, shared)
    out, expected = low_rank_linear_triton(*inputs, act), reference(*inputs, act)
    assert out.device == TRITON_DEVICE
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    expected_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    for g, r in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-11, atol=1e-11)


def test_every_tile_of_the_grouped_order_is_written_once():
    """More token blocks than a group (the kernel's GROUP_T), the last group short, and several output blocks: the
    grouped program order covers every (token block, output block) tile of every sample once, against the equation
    in fp64 (an unwritten tile would keep the output's uninitialised values, a doubled one is harmless but a
    misplaced one is not)."""
    from mmwf.models.layers.dynamic_linear_triton import GROUP_T, TILES
    block_t, block_co = TILES[0][:2]  # the interpreter's one tile; on a GPU the autotuner's pick, smaller or larger
    shape = (1, (GROUP_T + 2) * block_t + 5, 8, 3, block_co + 3)  # B, N, Cin, K, Cout
    inputs = operands(shape, False, requires_grad=False)
    torch.testing.assert_close(low_rank_linear_triton(*inputs), reference(*inputs, False), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('act', [False, True], ids=['linear', 'gelu'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_kernel_in_low_precision_sums_in_fp32(dtype, act):
    """fp32 and bf16 operands: t = x L rounded to the dtype by its GEMM, then Cin + K products summed in fp32 and one
    rounding at the store. Against fp64 on the rounded operands, the error is at most (Cin + K + 2) fp32 roundings of
    the sum of the terms' magnitudes, t's rounding (one ulp of the dtype, and its own Cin fp32 roundings) times |R|,
    and the store's ulp (Triton's interpreter converts to bf16 toward zero: one ulp, not half); GELU's slope is below
    1.13 and fp32 erf adds a few roundings of |z|. On a GPU each rounding of the sums counts twice
    (TENSOR_CORE_ROUNDINGS: the tensor cores' fp32 accumulation truncates), and t's GEMM sums in fp32 throughout."""
    B, N, cin, k, cout = 2, 37, 40, 9, 24
    x, w, b, left, right = (t.to(dtype) for t in operands((B, N, cin, k, cout), False, requires_grad=False))
    with fp32_sums_in_cublas():
        out = low_rank_linear_triton(x, w, b, left, right, act)
    assert out.dtype == dtype
    d = [t.double().cpu() for t in (x, w, b, left, right)]
    exact = reference(*d, act)
    xa, wa, ba, la, ra = (t.abs() for t in d)
    t_mag = xa @ la
    u32, ulp = torch.finfo(torch.float32).eps / 2, torch.finfo(dtype).eps
    magnitude = xa @ wa + t_mag @ ra + ba
    u32 = TENSOR_CORE_ROUNDINGS * u32
    bound = (cin + k + 2) * u32 * magnitude + (ulp + cin * u32) * (t_mag @ ra)
    if act:
        bound = 1.13 * bound + 8 * u32 * magnitude
    bound = bound + ulp * exact.abs() + torch.finfo(dtype).tiny
    error = (out.double().cpu() - exact).abs()
    assert (error <= bound).all(), (error / bound).max()
    assert error.max() > 0  # the bound is met by rounding, not by an fp64 evaluation


@pytest.mark.parametrize('order', ['tokens', 'core'])
def test_the_layer_takes_the_kernel_as_its_form(order):
    """BilateralDynamicLinear with form='fused' gives eq. 8 applied by eq. 3 (tests.reference), outputs and the
    gradients of every parameter, in both orders (rank N' per sample, or Cin / r shared by the batch)."""
    layer = randomised(BilateralDynamicLinear(20, 36, order=order, form='fused').double()).to(TRITON_DEVICE)
    x = torch.randn(3, 7 * 5, 20, dtype=torch.float64, device=TRITON_DEVICE, requires_grad=True)
    out = layer(x, (7, 5))
    expected = linear_output(layer, x, linear_delta(layer, x, (7, 5)))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    leaves = (x, *layer.parameters())
    grads = torch.autograd.grad(out.square().sum(), leaves)
    expected_grads = torch.autograd.grad(expected.square().sum(), leaves)
    for g, r in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_inference_blocks_take_gelu_in_the_epilogue():
    """WF-T-like blocks in inference with form='fused' and conv='triton' (the MLP's GELU in the kernel's epilogue)
    give what the materialized form and the grouped conv give."""
    model = randomised(WeightFormer(dict(embed_dims=24, depth=3, mlp_ratio=4), dynamic_blocks=[1]).double())
    model = model.to(TRITON_DEVICE).eval()
    image = torch.randn(2, 3, 80, 48, dtype=torch.float64, device=TRITON_DEVICE)
    with torch.no_grad():
        with evaluation(model, form='fused', conv='triton'):
            fused = model(image)
        with evaluation(model, form='materialized', conv='grouped'):
            reference_out = model(image)
    torch.testing.assert_close(fused, reference_out, rtol=1e-11, atol=1e-11)


@pytest.mark.filterwarnings('ignore:`torch.jit.trace:FutureWarning', 'ignore::torch.jit.TracerWarning')
def test_traced_graphs_keep_the_reference_evaluation():
    """TorchScript tracing (the FLOP counter, the TorchScript ONNX exporter) has no form for a Triton kernel: the
    layer's 'fused' and 'triton' choices give way to the traced entries there, and the traced graph computes the
    same function (in IEEE fp32 on a GPU, whose cuDNN convolutions take TF32 by default)."""
    model = randomised(WeightFormer(dict(embed_dims=24, depth=2, mlp_ratio=4), dynamic_blocks=[1],
                                    dynamic_linear=dict(type='BilateralDynamicLinear', form='fused'),
                                    dynamic_dwc=dict(type='AdaptiveDynamicDWConv', conv='triton')))
    model = model.to(TRITON_DEVICE).eval()
    image = torch.randn(1, 3, 64, 48, device=TRITON_DEVICE)
    with torch.no_grad(), full_fp32():
        traced = torch.jit.trace(model, image, check_trace=False)
        assert 'mmwf::' not in str(traced.inlined_graph)
        torch.testing.assert_close(traced(image), model(image), rtol=1e-4, atol=1e-5)


def test_compiled_graphs_call_the_operator_without_a_break():
    x, w, b, left, right = operands((2, 12, 8, 3, 10), False, torch.float32, requires_grad=False)
    compiled = torch.compile(lambda *a: low_rank_linear_triton(*a, True) * 2, backend='aot_eager', fullgraph=True)
    torch.testing.assert_close(compiled(x, w, b, left, right), low_rank_linear_triton(x, w, b, left, right, True) * 2)


def test_operator_registration_passes_opcheck():
    """torch.library.opcheck: the fake op's shapes and strides, the autograd registration, and the schema."""
    from mmwf.models.layers.dynamic_linear_triton import _low_rank_linear_op
    x, w, b, left, right = operands((2, 9, 8, 3, 10), False, torch.float64)
    t = torch.matmul(x, left).detach().requires_grad_()
    for gelu_flag in (False, True):
        torch.library.opcheck(_low_rank_linear_op, (x, t, w, right, b, gelu_flag))
        torch.library.opcheck(_low_rank_linear_op, (x, t, w, right[:1], None, gelu_flag))


def test_gradients_under_autocast_are_those_of_the_torch_evaluation():
    """Under bf16 autocast the kernel and torch's own evaluation of the same products (F.linear, matmul, baddbmm,
    which autocast casts alike) take the same bf16 operands and sum in fp32; each rounds its GEMMs' outputs to bf16.
    Their outputs and the fp32 parameters' gradients then differ by a few bf16 roundings of the largest term: here
    at most 8 ulps of bf16 (2^-5) of each result's largest magnitude. The gradients come back in the parameters'
    dtype."""
    torch.manual_seed(0)
    x, w, b, left, right = (t.to(TRITON_DEVICE) for t in (torch.randn(3, 37, 24), torch.randn(24, 40), torch.randn(40),
                                                         torch.randn(1, 24, 6), torch.randn(3, 6, 40)))
    leaves = tuple(t.requires_grad_() for t in (w, b, left, right))
    upstream = torch.randn(3, 37, 40, device=TRITON_DEVICE)
    results = []
    for fused in (True, False):
        with torch.autocast(TRITON_DEVICE.type, dtype=torch.bfloat16):
            out = low_rank_linear_triton(x, w, b, left, right) if fused else \
                torch.baddbmm(F.linear(x, w.t(), b), torch.matmul(x, left), right.to(torch.bfloat16))
        results.append((out, torch.autograd.grad(out, leaves, upstream.to(out.dtype))))
    (out, grads), (expected, expected_grads) = results
    assert out.dtype == expected.dtype == torch.bfloat16
    bound = 8 * torch.finfo(torch.bfloat16).eps
    assert (out.float() - expected.float()).abs().max() <= bound * expected.float().abs().max()
    for g, r, leaf in zip(grads, expected_grads, leaves, strict=True):
        assert g.dtype == r.dtype == leaf.dtype == torch.float32
        assert (g - r).abs().max() <= bound * r.abs().max(), leaf.shape


def test_shapes_that_do_not_fit_are_named():
    x, w, b, left, right = operands((2, 9, 8, 3, 10), False, torch.float32, requires_grad=False)
    with pytest.raises(ValueError, match=r'left \(2, 7, 3\) is not \(B or 1, 8, K\)'):
        low_rank_linear_triton(x, w, b, left[:, :7], right)
    with pytest.raises(ValueError, match=r'right \(2, 4, 10\)'):
        low_rank_linear_triton(x, w, b, left, torch.randn(2, 4, 10))
    with pytest.raises(ValueError, match=r'bias \(9,\)'):
        low_rank_linear_triton(x, w, b[:9], left, right)


def test_empty_batches_pass_through():
    x, w, b, left, right = operands((0, 9, 8, 3, 10), False, torch.float32)
    out = low_rank_linear_triton(x, w, b, left, right)
    assert out.shape == (0, 9, 10)
    grads = torch.autograd.grad(out.sum(), (x, w, b, left, right))
    assert all(g.shape == t.shape for g, t in zip(grads, (x, w, b, left, right)))
