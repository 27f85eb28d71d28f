"""Mixed precision against fp32 on one device, for the CUDA tests and their CPU stand-ins: a model's output and
parameter gradients under autocast compared with its fp32 pass, both passes drawing the same random numbers."""
from __future__ import annotations

import torch

# relative error bounds of autocast against fp32, in units of the low-precision dtype's unit roundoff u (bf16 3.9e-3,
# fp16 4.9e-4): WF-T at 224, random init, measured about 3 u on the output and 4 to 6 u on the parameter gradients
# in both dtypes (CPU bf16, CPU fp16); DeiT-T about a tenth of that. The bounds leave four times that room.
OUT_ROUNDOFFS, GRAD_ROUNDOFFS = 12, 25
LOSS_SCALE = {torch.float16: 2.0 ** 12}  # fp16 gradients underflow without loss scaling (as GradScaler does)


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Output of ``model(x)`` (the last map) and the gradients of its mean square w.r.t. every parameter, flat, under
    ``dtype`` autocast on x's device (None: fp32); the random draws of the pass (dropout, label dropout, stochastic
    depth) are the same in every call."""
    model.zero_grad()
    torch.manual_seed(0)
    scale = LOSS_SCALE.get(dtype, 1.0)
    with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        out = model(x)
        out = out[-1] if isinstance(out, (tuple, list)) else out
    (out.float().square().mean() * scale).backward()
    grads = torch.cat([p.grad.flatten() / scale for p in model.parameters() if p.grad is not None])
    return out.detach().float(), grads


def autocast_errors(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """Relative errors (output, gradients) of ``model`` in training mode under ``dtype`` autocast against fp32."""
    model.train()
    ref_out, ref_grad = run(model, x, None)
    out, grad = run(model, x, dtype)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    return relative_error(out, ref_out), relative_error(grad, ref_grad)


def check_autocast(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype) -> None:
    """:func:`autocast_errors` within :data:`OUT_ROUNDOFFS` / :data:`GRAD_ROUNDOFFS` unit roundoffs of ``dtype``."""
    out, grad = autocast_errors(model, x, dtype)
    u = unit_roundoff(dtype)
    assert out < OUT_ROUNDOFFS * u, (out, out / u)
    assert grad < GRAD_ROUNDOFFS * u, (grad, grad / u)


class Denoising(torch.nn.Module):
    """A denoiser called on latents alone (timesteps and labels fixed by the batch position), as the checks call."""

    def __init__(self, denoiser: torch.nn.Module) -> None:
        super().__init__()
        self.denoiser = denoiser

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i = torch.arange(len(x), device=x.device)
        return self.denoiser(x, i * 997 % 1000, i % 1000)


def shifted_denoiser(family: str, arch: str, **kwargs) -> torch.nn.Module:
    """A ``family`` denoiser (``'WeightFormerDiT'``, ``'DiT'``) with adaLN-Zero moved off its zero init, so that every
    branch counts."""
    from mmwf.registry import MODELS
    from tests.reference import randomised
    torch.manual_seed(0)
    return randomised(MODELS.build(dict(type=family, arch=arch, patch_size=2, **kwargs)), 0.02, around_init=True)
