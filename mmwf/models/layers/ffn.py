"""The blocks' feed-forward options (``ffn_type``): the released GELU MLP, or SwiGLU (Shazeer, 2020; the modern
block of LLaMA), ``W_down(SiLU(x W_gate) * (x W_up))``. SwiGLU's gate and up projections are packed in the block's
first projection (gate first, as timm's ``SwiGLUPacked``), so a dynamic first linear predicts both; its hidden
width is 2/3 of the MLP's (8/3 C for ``mlp_ratio`` 4), which keeps the parameter count."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .implementation import records_autograd

FFN_TYPES = ('mlp', 'swiglu')


def ffn_widths(dim: int, mlp_ratio: float, ffn_type: str) -> tuple[int, int]:
    """(the first projection's output width, the hidden width the second projection takes) of a ``dim``-channel
    block with ``mlp_ratio``."""
    if ffn_type not in FFN_TYPES:
        raise ValueError(f'ffn_type must be one of {FFN_TYPES}, got {ffn_type!r}')
    if ffn_type == 'mlp':
        return int(dim * mlp_ratio), int(dim * mlp_ratio)
    hidden = int(dim * mlp_ratio * 2 / 3)
    return 2 * hidden, hidden


def swiglu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """(..., 2h) packed [gate | up] -> (..., h): SiLU(gate) * up (``inplace``: into SiLU's fresh output)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up) if inplace else F.silu(gate) * up


class _GeluLinear(torch.autograd.Function):
    """linear(GELU(h)) that keeps only h for its backward pass and computes GELU(h) there again."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                approximate: str) -> torch.Tensor:
        ctx.save_for_backward(h, weight)
        ctx.approximate, ctx.has_bias = approximate, bias is not None
        return F.linear(F.gelu(h, approximate=approximate), weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, weight = ctx.saved_tensors
        flat = dy.reshape(-1, dy.shape[-1])
        grad_w = grad_b = grad_h = None
        if ctx.needs_input_grad[1]:  # dy^T GELU(h), in dy's dtype under autocast
            g = F.gelu(h, approximate=ctx.approximate).to(dy.dtype)
            grad_w = (flat.t() @ g.reshape(-1, g.shape[-1])).to(weight.dtype)
            del g  # freed before the hidden-sized product below, which can take its memory
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = flat.sum(0).to(weight.dtype)
        if ctx.needs_input_grad[0]:  # GELU'(h) * (dy W), written over dy W: one hidden-sized buffer, not two
            grad_h = dy @ weight.to(dy.dtype)
            grad_h = torch.ops.aten.gelu_backward.grad_input(grad_h, h.to(dy.dtype), approximate=ctx.approximate,
                                                             grad_input=grad_h).to(h.dtype)
        return grad_h, grad_w, grad_b, None


def gelu_linear(h: torch.Tensor, linear: nn.Linear, approximate: str = 'none', inplace: bool = False) -> torch.Tensor:
    """``linear(F.gelu(h, approximate=approximate))`` for the hidden tokens h (..., hidden) of an MLP, the blocks'
    one memory rule for their largest activation. While autograd records (training), GELU(h) is computed again in
    the backward pass instead of being kept: the MLP keeps its hidden tensor once, not twice, for one more
    element-wise pass. Otherwise (inference) with ``inplace`` (h is a fresh output no one else holds), GELU
    overwrites h: one hidden-sized buffer, not two."""
    if records_autograd(h, linear.weight):
        return _GeluLinear.apply(h, linear.weight, linear.bias, approximate)
    return linear(torch.ops.aten.gelu_(h, approximate=approximate) if inplace else F.gelu(h, approximate=approximate))
