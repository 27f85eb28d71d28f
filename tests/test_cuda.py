"""CUDA checks (``pytest -m cuda``; skipped without a CUDA device): the backbones, every attention operator, the
neck and the two denoisers (B/2, activation checkpointing on) under fp16 / bf16 autocast against fp32 on the same
device, the batched per-sample depthwise convolution
(grouped and shift-sum) against the CPU loop, and peak memory of WF-T vs DeiT-T at 1024 and 1248.

Needs torch, timm and mmengine only (no mmcv / mmdet / mmseg), like the backbones themselves.
"""
from __future__ import annotations

import pytest
import torch

import mmwf  # noqa: F401
from mmwf.models.backbones import DeiT, WeightFormer
from mmwf.models.layers import OPERATORS, AdaptiveDynamicDWConv
from mmwf.models.necks import SimpleFeaturePyramid
from mmwf.registry import MODELS

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')]
DEVICE = 'cuda'
# relative error bounds of autocast against fp32 (random init, whole network; measured on CPU autocast at 224:
# WF-T bf16 1.2e-2 / 2.1e-2, fp16 1.4e-3 / 1.8e-3 for output / parameter gradients; DeiT-T 10x lower)
TOLERANCE = {torch.float16: dict(out=1e-2, grad=2e-2), torch.bfloat16: dict(out=5e-2, grad=1e-1)}
LOSS_SCALE = {torch.float16: 2.0 ** 12}  # fp16 gradients underflow without loss scaling (as GradScaler does)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Output of ``model(x)`` (the last map) and the gradients of its mean square w.r.t. every parameter, flat."""
    model.zero_grad()
    scale = LOSS_SCALE.get(dtype, 1.0)
    with torch.autocast(DEVICE, dtype=dtype or torch.float32, enabled=dtype is not None):
        out = model(x)
        out = out[-1] if isinstance(out, (tuple, list)) else out
    (out.float().square().mean() * scale).backward()
    grads = torch.cat([p.grad.flatten() / scale for p in model.parameters() if p.grad is not None])
    return out.detach().float(), grads


def check_autocast(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype) -> None:
    model = model.to(DEVICE).train()
    x = x.to(DEVICE)
    ref_out, ref_grad = run(model, x, None)
    out, grad = run(model, x, dtype)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    bound = TOLERANCE[dtype]
    assert relative_error(out, ref_out) < bound['out'], relative_error(out, ref_out)
    assert relative_error(grad, ref_grad) < bound['grad'], relative_error(grad, ref_grad)


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


class Denoising(torch.nn.Module):
    """A denoiser called on latents alone (timesteps and labels fixed by the batch position), as the checks call."""

    def __init__(self, denoiser: torch.nn.Module) -> None:
        super().__init__()
        self.denoiser = denoiser

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i = torch.arange(len(x), device=x.device)
        return self.denoiser(x, i * 997 % 1000, i % 1000)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
@pytest.mark.parametrize('family', ['WeightFormerDiT', 'DiT'])
def test_denoiser_autocast_with_checkpointing_matches_fp32(family, dtype):
    """The configs' *_b_2_in256_bf16 / _fp16 models (adaLN-Zero moved off its zero init, so every branch counts)."""
    torch.manual_seed(0)
    denoiser = MODELS.build(dict(type=family, arch='B', patch_size=2, with_cp=True))
    with torch.no_grad():
        for p in denoiser.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    check_autocast(Denoising(denoiser), torch.randn(4, 4, 32, 32), dtype)


@pytest.mark.parametrize('impl', ['auto', 'grouped', 'shift'])
def test_per_sample_depthwise_conv_on_cuda_matches_the_cpu_loop(impl):
    """The batched CUDA evaluations (one grouped conv, the shift-sum of compiled graphs) against the eager CPU
    per-sample loop: outputs and gradients."""
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
