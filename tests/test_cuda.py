"""CUDA checks (``pytest -m cuda``; skipped without a CUDA device): the backbones, every attention operator, the
neck and the two denoisers (B/2, activation checkpointing on) under fp16 / bf16 autocast against fp32 on the same
device, the batched per-sample depthwise convolution (grouped, shift-sum, Triton) against the CPU loop, and peak memory
of WF-T vs DeiT-T at 1024 and 1248.

Every comparison is deterministic and in true fp32 where it says fp32: TF32 is off for each test (cuDNN runs
convolutions in TF32 by default from Ampere on, 10 mantissa bits), and the two passes of a training-mode model
draw the same dropout (the generator seeded before each). Needs torch, timm and mmengine only (no mmcv / mmdet /
mmseg), like the backbones themselves.
"""
from __future__ import annotations

import pytest
import torch

import mmwf  # noqa: F401
from mmwf.models.backbones import DeiT, WeightFormer
from mmwf.models.layers import OPERATORS, AdaptiveDynamicDWConv
from mmwf.models.necks import SimpleFeaturePyramid
from mmwf.registry import MODELS
from tests import mixed_precision
from tests.mixed_precision import Denoising, shifted_denoiser

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')]
DEVICE = 'cuda'


@pytest.fixture(autouse=True)
def no_tf32():
    """fp32 matrix products and convolutions in full precision for the test, the flags restored after it."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def check_autocast(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype) -> None:
    mixed_precision.check_autocast(model.to(DEVICE), x.to(DEVICE), dtype)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
@pytest.mark.parametrize('arch', ['t', 's'])
def test_weightformer_autocast_matches_fp32(arch, dtype):
    check_autocast(WeightFormer(arch, out_indices=(4, 8, 12, 16)), torch.randn(2, 3, 224, 224), dtype)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
@pytest.mark.parametrize('op', [c.__name__ for c in OPERATORS.values()])
def test_deit_operator_autocast_matches_fp32(op, dtype):
    cls = MODELS.get(op).with_cls_token
    check_autocast(DeiT('t', attn_cfg=dict(type=op), with_cls_token=cls), torch.randn(2, 3, 224, 224), dtype)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
def test_windowed_deit_and_neck_autocast_match_fp32(dtype):
    backbone = DeiT('t', with_cls_token=False, window_size=14, window_block_indexes=(0, 1, 3, 4, 6, 7, 9, 10))
    model = torch.nn.Sequential(backbone, SimpleFeaturePyramid(192))
    check_autocast(model, torch.randn(1, 3, 512, 512), dtype)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
@pytest.mark.parametrize('family', ['WeightFormerDiT', 'DiT'])
def test_denoiser_autocast_with_checkpointing_matches_fp32(family, dtype):
    """The configs' *_b_2_in256_bf16 / _fp16 models, in training mode (label dropout drawn alike in both passes)."""
    denoiser = shifted_denoiser(family, 'B', with_cp=True)
    check_autocast(Denoising(denoiser), torch.randn(4, 4, 32, 32), dtype)


@pytest.mark.parametrize('impl', ['auto', 'grouped', 'taps', 'shift', 'triton'])
def test_per_sample_depthwise_conv_on_cuda_matches_the_cpu_loop(impl):
    """The batched CUDA evaluations (one grouped conv, the taps of exported graphs, the shift-sum of compiled graphs,
    the Triton kernels) against the eager CPU per-sample loop: outputs and gradients."""
    from mmwf.models.layers.dynamic_dwconv import per_sample_depthwise_conv
    x, w, b = torch.randn(4, 64, 23, 31), torch.randn(4, 64, 3, 3), torch.randn(64)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = per_sample_depthwise_conv(*leaves, impl='loop')
    ref_grads = torch.autograd.grad(ref.square().sum(), leaves)
    cuda = [t.to(DEVICE).requires_grad_() for t in (x, w, b)]
    out = per_sample_depthwise_conv(*cuda, impl=impl)
    grads = torch.autograd.grad(out.square().sum(), cuda)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.cpu(), r, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['fp32', 'bf16'])
@pytest.mark.parametrize('shared', [False, True], ids=['per-sample', 'shared'])
def test_triton_depthwise_conv_on_cuda_within_its_rounding(dtype, shared):
    """The Triton kernel on the device against fp64 on the rounded inputs (WF-T's width, a 1024 grid, odd
    batch): at most K*K + 1 fp32 roundings of the terms' magnitudes plus half an ulp of the dtype at the store."""
    from mmwf.models.layers.dwconv_triton import per_sample_dwconv_triton
    from tests.models.layers.test_dwconv_triton import reference
    B, (H, W), C = 3, (64, 63), 192
    x, taps = torch.randn(B, H * W, C).to(dtype), torch.randn(1 if shared else B, 9, C).to(dtype)
    out = per_sample_dwconv_triton(x.to(DEVICE), (H, W), taps.to(DEVICE)).cpu().double()
    exact = reference(x.double(), (H, W), taps.double(), None)
    scale = reference(x.double().abs(), (H, W), taps.double().abs(), None)
    bound = (10 * torch.finfo(torch.float32).eps / 2 + torch.finfo(dtype).eps / 2) * scale
    assert ((out - exact).abs() <= bound).all()


@pytest.mark.parametrize('act', [False, True], ids=['linear', 'gelu'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['fp32', 'bf16'])
def test_triton_dynamic_linear_on_cuda_within_its_rounding(dtype, act):
    """The fused dynamic linear on the device (WF-T's first linear, 192 -> 768, rank 48, a 64 x 63 grid, odd batch)
    against fp64 on the rounded operands: the bound of the interpreter's test with half an ulp at the store (a GPU
    rounds to nearest), each fp32 rounding of the sums counted twice (the tensor cores' accumulation truncates) and
    t = x L summed in fp32 by cuBLAS, TF32 off as torch's default; and its gradients against the einsum reference in
    fp32."""
    from mmwf.models.layers.dynamic_linear_triton import low_rank_linear_triton
    from tests.models.layers.test_dynamic_linear_triton import reference
    from tests.triton_device import TENSOR_CORE_ROUNDINGS, fp32_sums_in_cublas
    B, N, cin, k, cout = 3, 64 * 63, 192, 48, 768
    ops = [torch.randn(*s).to(dtype) for s in ((B, N, cin), (cin, cout), (cout,), (1, cin, k), (B, k, cout))]
    with fp32_sums_in_cublas():
        out = low_rank_linear_triton(*(t.to(DEVICE) for t in ops), act).cpu().double()
    d = [t.double() for t in ops]
    exact = reference(*d, act)
    xa, wa, ba, la, ra = (t.abs() for t in d)
    u32, ulp = TENSOR_CORE_ROUNDINGS * torch.finfo(torch.float32).eps / 2, torch.finfo(dtype).eps
    magnitude = xa @ wa + (xa @ la) @ ra + ba
    bound = (cin + k + 2) * u32 * magnitude + (ulp / 2 + cin * u32) * ((xa @ la) @ ra)
    if act:
        bound = 1.13 * bound + 8 * u32 * magnitude
    assert ((out - exact).abs() <= bound + ulp / 2 * exact.abs()).all()
    leaves = [t.float().to(DEVICE).requires_grad_() for t in ops]
    grads = torch.autograd.grad(low_rank_linear_triton(*leaves, act).square().sum(), leaves)
    expected = torch.autograd.grad(reference(*leaves, act).square().sum(), leaves)
    for g, r in zip(grads, expected, strict=True):  # fp32 sums over up to 12,096 terms, in two orders
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5 * r.abs().max().item())


def test_dynamic_dwconv_layer_on_cuda_matches_cpu():
    layer = AdaptiveDynamicDWConv(64)
    hw = (23, 31)
    x = torch.randn(3, hw[0] * hw[1], 64)
    ref = layer(x, hw)
    torch.testing.assert_close(layer.to(DEVICE)(x.to(DEVICE), hw).cpu(), ref, rtol=1e-4, atol=1e-4)


def forward_peak_mb(model: torch.nn.Module, size: int) -> float:
    """Activation memory (MB above the weights) of one inference forward at ``size`` x ``size``, batch 1."""
    model = model.to(DEVICE).eval()
    x = torch.randn(1, 3, size, size, device=DEVICE)
    with torch.inference_mode():
        model(x)  # warm-up (kernels, workspaces)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model(x)
        torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def test_peak_memory_weightformer_vs_deit_at_1024_and_1248():
    """Prints the figures; WF-T's activation memory grows linearly with the tokens (1.49x from 1024 to 1248)."""
    rows = {}
    for name, build in (('WF-T', lambda: WeightFormer('t')), ('DeiT-T', lambda: DeiT('t', with_cls_token=False))):
        rows[name] = [forward_peak_mb(build(), size) for size in (1024, 1248)]
        torch.cuda.empty_cache()
    print('\n| model | activations 1024 (MB) | activations 1248 (MB) |\n|---|---|---|')
    for name, (a, b) in rows.items():
        print(f'| {name} | {a:.1f} | {b:.1f} |')
    wf_1024, wf_1248 = rows['WF-T']
    assert 0 < wf_1024 and wf_1248 / wf_1024 < 1.8


def test_a_forked_tool_run_uses_the_device():
    """The fork server (mmwf/utils/fork_server.py) imports mmwf without initialising the CUDA driver (mmengine asks
    whether CUDA is available at import): its children, the tools that the suite and the GPU check fork, use it."""
    from tests.tool_runner import fork_server, run_python
    res = run_python(['-c', 'import torch; x = torch.ones(2, device="cuda"); print(float((x + 1).sum().cpu()))'],
                     fork=True)
    assert fork_server().refused is None
    assert res.returncode == 0 and res.stdout == '4.0\n', res.stderr
