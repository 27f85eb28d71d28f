"""Attention operators for DeiT, all in timm's shapes: softmax attention and its linear-complexity replacements
ELU, ReLU, InLine and MHLA (TTT is in ``ttt_attention.py``).

Every operator keeps timm's projection names and shapes (``qkv`` Linear(C, 3C) with bias, ``proj``
Linear(C, C)), so softmax DeiT weights transfer; heads of d = C / h channels as DeiT splits them. Each maps
tokens x (B, N, C) on the patch grid ``hw`` to (B, N, C); the linear ones at O(N C d) cost. Their sums over tokens
and normalising divisions run in fp32 (autocast off): in fp16 they overflow for large N.
Sections cited below are those of docs/linear_attention.md.
"""
from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmwf.registry import MODELS

from .tokens import partition, unpartition


def split_heads(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, N, 3C) in timm's row layout [q | k | v], head-major -> q, k, v each (B, h, N, d)."""
    B, N, C3 = qkv.shape
    q, k, v = qkv.reshape(B, N, 3, num_heads, C3 // (3 * num_heads)).permute(2, 0, 3, 1, 4)
    return q, k, v


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, N, d) -> (B, N, h * d)."""
    B, h, N, d = x.shape
    return x.transpose(1, 2).reshape(B, N, h * d)


def without_autocast(device_type: str) -> AbstractContextManager:
    """Autocast off on ``device_type`` (nothing to switch off where autocast does not exist, e.g. 'meta')."""
    return torch.autocast(device_type, enabled=False) if torch.amp.is_autocast_available(device_type) else nullcontext()


def accumulation_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32, or the input's dtype when it is wider (fp64 in tests)."""
    return torch.promote_types(t.dtype, torch.float32)


def check_patch_tokens(x: torch.Tensor, hw: tuple[int, int], operator: str) -> None:
    """Operators without a class token need exactly the H x W patch tokens."""
    if x.shape[1] != hw[0] * hw[1]:
        raise ValueError(f'{operator} takes exactly the {hw[0]} x {hw[1]} patch tokens (no class token); got '
                         f'{x.shape[1]} tokens. Build the DeiT backbone with with_cls_token=False.')


def kernel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float) -> torch.Tensor:
    """o_i = q_i^T S / (q_i^T z + eps) with S = sum_j k_j v_j^T, z = sum_j k_j (eq. of section 2), for
    feature-mapped q, k (..., N, d) and v (..., N, d); in fp32, returned in v's dtype."""
    dtype, acc = v.dtype, accumulation_dtype(v)
    with without_autocast(q.device.type):
        q, k, v = q.to(acc), k.to(acc), v.to(acc)
        kv = k.transpose(-2, -1) @ v
        z = k.sum(-2, keepdim=True)
        out = (q @ kv) / ((q * z).sum(-1, keepdim=True) + eps)
    return out.to(dtype)


class AttentionBase(nn.Module):
    """timm-shaped projections shared by the attention operators: ``qkv`` Linear(C, 3C), heads split, a per-head
    token mixing (:meth:`mix`), heads merged, ``proj`` Linear(C, C).

    Args:
        dim (int): token channels C.
        num_heads (int): heads h (C must be divisible by h).
        qkv_bias (bool): bias of ``qkv``. Defaults to True.
        proj_drop (float): dropout after ``proj``. Defaults to 0.

    ``with_cls_token``: whether the operator accepts a class token (MHLA and TTT need the tokens to be exactly
    the H x W grid).
    """

    with_cls_token = True

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, proj_drop: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """Per-head token mixing: q, k, v (B, h, N, d) -> (B, h, N, d)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """Tokens (B, N, C) -> (B, N, C)."""
        q, k, v = split_heads(self.qkv(x), self.num_heads)
        return self.proj_drop(self.proj(merge_heads(self.mix(q, k, v, hw))))


@MODELS.register_module()
class SoftmaxAttention(AttentionBase):
    """Softmax multi-head self-attention (DeiT / timm): softmax(q k^T / sqrt(d)) v per head, fused
    (``scaled_dot_product_attention``). ``hw`` is unused."""

    def mix(self, q, k, v, hw):
        return F.scaled_dot_product_attention(q, k, v)


class KernelAttention(AttentionBase):
    """Kernel (linear) attention: o_i = phi(q_i)^T sum_j phi(k_j) v_j^T / (phi(q_i)^T sum_j phi(k_j) + eps)
    (:func:`kernel_attention`); a subclass defines the feature map :meth:`phi`.

    Args:
        dim (int): channels C.
        num_heads (int): heads.
        eps (float): added to the normaliser. Defaults to 1e-6.
    """

    def __init__(self, dim: int, num_heads: int, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.eps = eps

    @staticmethod
    def phi(x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def mix(self, q, k, v, hw):
        return kernel_attention(self.phi(q), self.phi(k), v, self.eps)


@MODELS.register_module()
class ELUAttention(KernelAttention):
    """Katharopoulos et al. (2020): phi(x) = ELU(x) + 1 on raw q, k (no temperature), eps = 1e-6."""

    @staticmethod
    def phi(x: torch.Tensor) -> torch.Tensor:
        return F.elu(x) + 1


@MODELS.register_module()
class ReLUAttention(KernelAttention):
    """ReLU linear attention: phi = ReLU (scale-invariant, so no temperature), eps = 1e-6. A token whose
    phi(q) is zero gets a zero output."""

    @staticmethod
    def phi(x: torch.Tensor) -> torch.Tensor:
        return F.relu(x)


@MODELS.register_module()
class InLineAttention(AttentionBase):
    """InLine attention (Han et al., 2024), attention-only form (no local residual branch).

    Weights A_ij = (s/N) q_i^T k_j + (1/N)(1 - s q_i^T kbar), s = d^-1/2 (rows sum to 1), evaluated in the
    centred form o_i = vbar + s q_i^T Sigma_KV, Sigma_KV = (1/N) sum_j (k_j - kbar)(v_j - vbar)^T (section 4).
    """

    def mix(self, q, k, v, hw):
        dtype, acc, N = v.dtype, accumulation_dtype(v), v.shape[-2]
        with without_autocast(q.device.type):
            q, k, v = q.to(acc), k.to(acc), v.to(acc)
            vbar = v.mean(-2, keepdim=True)
            cov = (k - k.mean(-2, keepdim=True)).transpose(-2, -1) @ (v - vbar) / N
            out = vbar + (q * self.head_dim ** -0.5) @ cov
        return out.to(dtype)


def block_distance_mixing(grid: tuple[int, int], transform: str = 'cos') -> torch.Tensor:
    """MHLA's initial mixing matrix M (P x P) for a P_h x P_w block layout (section 5): m = f(D / max D) of the
    distances between block centres (row-major block index), each column normalised to sum 1."""
    rows, cols = grid
    centres = torch.tensor([(r + 0.5, c + 0.5) for r in range(rows) for c in range(cols)], dtype=torch.float64,
                           device='cpu')
    dist = torch.cdist(centres, centres)
    rel = dist / dist.max() if dist.max() > 0 else dist
    if transform == 'cos':
        m = torch.cos(rel * math.pi / 4)
    elif transform == 'linear':
        m = 1 - rel
    else:
        raise ValueError(f"unknown MHLA mixing init {transform!r}; choose 'cos' or 'linear'")
    return (m / m.sum(0, keepdim=True)).to(torch.get_default_device(), torch.float32)  # where the model is built


@MODELS.register_module()
class MHLAttention(AttentionBase):
    """Multi-head linear attention (Zhang et al., ICLR 2026), token-level blocks (section 5).

    The grid is cut into a fixed ``blocks`` = P_h x P_w layout (2 x 2 by default, so the learned P x P mixing
    matrix transfers to any grid); block size ceil(H / P_h) x ceil(W / P_w), the grid zero-padded and the padded
    tokens masked out. Per head and block p: S_p = sum_i phi(k_i) v_i^T, z_p = sum_i phi(k_i) with
    phi = ReLU + 1e-6; S~_p = sum_p' M[p, p'] S_p'; o = phi(q)^T S~_p / n, plus a 5 x 5 depthwise conv of v
    (``lepe``) before ``proj``. Normaliser n (``normalizer``):

    - ``'official'`` (the MHLA release): n_{p,i} = sum_p' M[p, p'] phi(q_{p',i})^T z_p' + 1e-6 (it pairs
      in-block position i across blocks);
    - ``'textbook'``: n_{p,i} = phi(q_{p,i})^T sum_p' M[p, p'] z_p' + 1e-6.

    No class token: tokens must be exactly the H x W grid, in raster order.

    Args:
        dim (int): token channels C.
        num_heads (int): heads h.
        blocks (tuple[int, int]): block layout (P_h, P_w). Defaults to (2, 2).
        normalizer (str): ``'official'`` or ``'textbook'``. Defaults to ``'official'``.
        mixing_init (str): init of M from block distances, ``'cos'`` or ``'linear'``. Defaults to ``'cos'``.
        lepe_kernel (int): kernel of the LePE depthwise conv. Defaults to 5.
        **kwargs: ``qkv_bias``, ``proj_drop`` of :class:`AttentionBase`.
    """

    with_cls_token = False

    def __init__(self, dim: int, num_heads: int, blocks: tuple[int, int] = (2, 2), normalizer: str = 'official',
                 mixing_init: str = 'cos', lepe_kernel: int = 5, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        if normalizer not in ('official', 'textbook'):
            raise ValueError(f"MHLA normalizer must be 'official' or 'textbook', got {normalizer!r}")
        self.blocks, self.normalizer = tuple(blocks), normalizer
        self.lepe = nn.Conv2d(dim, dim, lepe_kernel, padding=lepe_kernel // 2, groups=dim)
        self.block_mixing = nn.Parameter(block_distance_mixing(self.blocks, mixing_init))

    def block_size(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Tokens per block (ceil(H / P_h), ceil(W / P_w)) for the fixed block layout."""
        return (hw[0] + self.blocks[0] - 1) // self.blocks[0], (hw[1] + self.blocks[1] - 1) // self.blocks[1]

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """Patch tokens (B, H*W, C) in raster order on grid ``hw`` -> (B, H*W, C)."""
        check_patch_tokens(x, hw, 'MHLA')
        B, N, C = x.shape
        H, W = hw
        q, k, v = split_heads(self.qkv(x), self.num_heads)
        lepe = self.lepe(merge_heads(v).transpose(1, 2).reshape(B, C, H, W)).flatten(2).transpose(1, 2)
        out = self.mix(q, k, v, hw)
        return self.proj_drop(self.proj(merge_heads(out) + lepe))

    def mix(self, q, k, v, hw):
        dtype, acc = v.dtype, accumulation_dtype(v)
        block = self.block_size(hw)

        def blocks(t: torch.Tensor) -> torch.Tensor:  # (B, h, H*W, d) -> (B, h, P, w, d), zero-padded
            return partition(t, hw, block, self.blocks)

        valid = blocks(q.new_ones(1, 1, q.shape[-2], 1, dtype=acc))
        with without_autocast(q.device.type):
            m = self.block_mixing.to(acc)
            q = blocks(F.relu(q.to(acc)) + 1e-6) * valid
            k = blocks(F.relu(k.to(acc)) + 1e-6) * valid
            v = blocks(v.to(acc))
            kv = torch.einsum('qp,bhpde->bhqde', m, k.transpose(-2, -1) @ v)
            z = k.sum(-2)
            if self.normalizer == 'official':
                den = torch.einsum('qp,bhpw->bhqw', m, (q * z.unsqueeze(-2)).sum(-1)).unsqueeze(-1)
            else:
                den = (q * torch.einsum('qp,bhpd->bhqd', m, z).unsqueeze(-2)).sum(-1, keepdim=True)
            out = (q @ kv) / (den + 1e-6)
        return unpartition(out, hw, block, self.blocks).to(dtype)
