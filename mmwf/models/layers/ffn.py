"""The blocks' feed-forward options (``ffn_type``): the released GELU MLP, or SwiGLU (Shazeer, 2020; the modern
block of LLaMA), ``W_down(SiLU(x W_gate) * (x W_up))``. SwiGLU's gate and up projections are packed in the block's
first projection (gate first, as timm's ``SwiGLUPacked``), so a dynamic first linear predicts both; its hidden
width is 2/3 of the MLP's (8/3 C for ``mlp_ratio`` 4), which keeps the parameter count."""
from __future__ import annotations

import torch
import torch.nn.functional as F

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
