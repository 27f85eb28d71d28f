"""Test-time-training attention: the ViT^3 block (Han et al., CVPR 2026) with DeiT's head split.

Two inner models are trained by one closed-form gradient step (eta = 1) on the image's own key-value pairs
and then applied to the queries (docs/linear_attention.md section 6):

- per head, a simplified SwiGLU f(k) = (k W1) * SiLU(k W2) with fast weights W1, W2 (d x d);
- one extra head of d channels, a 3 x 3 depthwise conv f(K2) = DWConv(K2; w3).

Inner losses are scaled negative dot products, l1 = -(s/N) sum_i <f(k_i), v_i>, l2 = -(s/HW) sum f(K2) * V2,
with s = 1/3; each gradient is clipped as G / (||G|| + 1) (per output column for W1, W2; per channel's 3 x 3
kernel for w3). Outer gradients flow through the inner step (ordinary autograd over the closed form).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmwf.registry import MODELS

from .attention import check_patch_tokens, merge_heads
from .dynamic_dwconv import per_sample_depthwise_conv
from .implementation import check_choice


def swiglu_inner_grads(k: torch.Tensor, v: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of l1 = -(s/N) sum_i <(k_i W1) * SiLU(k_i W2), v_i> w.r.t. W1 and W2 (section 6.2).

    k, v: (B, h, N, d); w1, w2: (1 or B, h, d, d). Returns G1, G2 (B, h, d, d):
    G1 = K^T (E * SiLU(Z2)), G2 = K^T (E * Z1 * SiLU'(Z2)) with Z1 = K W1, Z2 = K W2, E = -(s/N) V.
    """
    z1, z2 = k @ w1, k @ w2
    sig = torch.sigmoid(z2)
    e = v * (-scale / k.shape[-2])
    kt = k.transpose(-2, -1)
    g1 = kt @ (e * z2 * sig)
    g2 = kt @ (e * z1 * sig * (1 + z2 * (1 - sig)))
    return g1, g2


def dwconv_inner_grad(k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Gradient of l2 = -(s/HW) sum_{c,y,x} DWConv3x3(K2; w3)[c,y,x] V2[c,y,x] w.r.t. w3 (section 6.3).

    k, v: (B, d, H, W). Returns (B, d, 3, 3): G3[c, a, b] = -(s/HW) sum_{y,x} K2pad[c, y+a, x+b] V2[c, y, x].
    """
    H, W = k.shape[-2:]
    kp = F.pad(k, (1, 1, 1, 1))
    g = torch.stack([(kp[..., a:a + H, b:b + W] * v).sum((-2, -1)) for a in range(3) for b in range(3)], -1)
    return g.unflatten(-1, (3, 3)) * (-scale / (H * W))


def clip_columns(g: torch.Tensor) -> torch.Tensor:
    """G[:, c] / (||G[:, c]|| + 1): each output column's step has norm < 1."""
    return g / (torch.linalg.vector_norm(g, dim=-2, keepdim=True) + 1)


@MODELS.register_module()
class TTTAttention(nn.Module):
    """ViT^3 test-time-training block in DeiT shapes.

    ``qkv`` Linear(C, 3C + 3d): rows [0:3C] are timm's q, k, v (head-major), rows [3C:3C+3d] the conv head's
    q2, k2, v2; ``proj`` Linear(C + d, C) reads the C SwiGLU channels then the d conv channels. ``w1``, ``w2``
    (1, h, d, d) and ``w3`` (d, 1, 3, 3) are the inner models' initial weights. No class token.

    Tokens (B, H*W, C) in raster order on grid ``hw`` -> (B, H*W, C).

    Args:
        dim (int): token channels C.
        num_heads (int): heads h of the SwiGLU branch (d = C / h channels each, and d in the conv head).
        qkv_bias (bool): bias of ``qkv``. Defaults to True.
        scale (float): s of the inner losses. Defaults to 1/3.
        proj_drop (float): dropout after ``proj``. Defaults to 0.
        conv (str): the conv head's per-sample depthwise conv (:func:`per_sample_depthwise_conv`). Defaults to
            ``'auto'``.
    """

    with_cls_token = False
    choices = ('conv',)

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, scale: float = 1 / 3,
                 proj_drop: float = 0.0, conv: str = 'auto') -> None:
        super().__init__()
        self.conv = check_choice('conv', conv)
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        d = dim // num_heads
        self.num_heads, self.head_dim, self.scale = num_heads, d, scale
        self.qkv = nn.Linear(dim, 3 * dim + 3 * d, bias=qkv_bias)
        self.w1 = nn.Parameter(torch.empty(1, num_heads, d, d))
        self.w2 = nn.Parameter(torch.empty(1, num_heads, d, d))
        self.w3 = nn.Parameter(torch.empty(d, 1, 3, 3))
        for w in (self.w1, self.w2, self.w3):
            nn.init.trunc_normal_(w, std=0.02)
        self.proj = nn.Linear(dim + d, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def swiglu_head(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v (B, h, N, d) -> (B, h, N, d): one inner step on (k, v), then applied to q."""
        g1, g2 = swiglu_inner_grads(k, v, self.w1, self.w2, self.scale)
        w1, w2 = self.w1 - clip_columns(g1), self.w2 - clip_columns(g2)
        return (q @ w1) * F.silu(q @ w2)

    def conv_head(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v (B, d, H, W) -> (B, d, H, W): one inner step of the depthwise conv, applied to q."""
        g3 = dwconv_inner_grad(k, v, self.scale)
        g3 = g3 / (torch.linalg.vector_norm(g3, dim=(-2, -1), keepdim=True) + 1)
        return per_sample_depthwise_conv(q, self.w3.squeeze(1) - g3, impl=self.conv)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        check_patch_tokens(x, hw, 'TTT')
        B, N, C = x.shape
        H, W = hw
        h, d = self.num_heads, self.head_dim
        qkv = self.qkv(x)
        q, k, v = qkv[..., :3 * C].reshape(B, N, 3, h, d).permute(2, 0, 3, 1, 4)
        q2, k2, v2 = qkv[..., 3 * C:].reshape(B, H, W, 3, d).permute(3, 0, 4, 1, 2)
        o1 = merge_heads(self.swiglu_head(q, k, v))
        o2 = self.conv_head(q2, k2, v2).flatten(2).transpose(1, 2)
        return self.proj_drop(self.proj(torch.cat([o1, o2], -1)))
