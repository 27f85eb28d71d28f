"""Dynamic depthwise convolutions: W(X) = W0 + dW(X), paper eq. 9, with the predictors of Table 1
(eqs. 10-13).

Every layer maps tokens x (B, H*W, C) on an H x W grid to (B, H*W, C) with a per-sample depthwise K x K
kernel (padding K // 2). Static kernel ``w`` (C, 1, K, K) and bias ``b`` (C), as in the release.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.init import trunc_normal_

from mmwf.registry import MODELS

from .tokens import map_to_tokens, tokens_to_map


def unit_clip(dw: torch.Tensor) -> torch.Tensor:
    """dW / (||dW||_F over the K x K kernel + 1), the release's normalisation of a (B, C, K, K) update."""
    return dw / (dw.flatten(2).norm(dim=-1)[..., None, None] + 1)


class DynamicDWConv(nn.Module):
    """Base class: per-sample depthwise conv with kernel w + dW(X). Subclasses implement :meth:`delta`.

    Args:
        dim (int): channels C.
        kernel_size (int): K. Defaults to 3.
    """

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.dim, self.kernel_size = dim, kernel_size
        self.w = nn.Parameter(trunc_normal_(torch.empty(dim, 1, kernel_size, kernel_size), std=0.02))
        self.b = nn.Parameter(trunc_normal_(torch.empty(dim), std=0.02))

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """Predict dW (B, C, K, K) from the map x (B, C, H, W)."""
        raise NotImplementedError

    def effective_delta(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """The update added to ``w`` for tokens x (B, H*W, C): (B, C, K, K)."""
        return self.delta(tokens_to_map(x, hw))

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = tokens_to_map(x, hw)
        weight = self.w + self.delta(x).unsqueeze(2)  # (B, C, 1, K, K)
        # one depthwise conv per sample on channels-last views: far faster on CPU than a single
        # (1, B*C, H, W) grouped conv, which needs an NCHW copy and takes PyTorch's slow path
        y = torch.cat([F.conv2d(x[i:i + 1], weight[i], self.b, padding=self.kernel_size // 2, groups=self.dim)
                       for i in range(x.shape[0])])
        return map_to_tokens(y)

    def extra_repr(self) -> str:
        return f'dim={self.dim}, kernel_size={self.kernel_size}'


@MODELS.register_module()
class GAPDynamicDWConv(DynamicDWConv):
    """Eq. 10: dW = reshape(MLP(GAP(X))), MLP = Linear(C, C) -> GELU -> Linear(C, C*K*K)."""

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__(dim, kernel_size)
        self.wfm = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim * kernel_size ** 2))

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kernel_size
        return unit_clip(self.wfm(x.mean((2, 3))).view(-1, self.dim, k, k))


@MODELS.register_module()
class AdaptiveDynamicDWConv(DynamicDWConv):
    """Eq. 11, Spatially Adaptive (released): dW = MLP(AAP(X, (K, K))), MLP = 1x1 conv (bias) -> GELU ->
    1x1 conv (no bias) as ``wfm.0`` / ``wfm.2``, then the release's normalisation."""

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__(dim, kernel_size)
        self.wfm = nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU(), nn.Conv2d(dim, dim, 1, bias=False))

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        return unit_clip(self.wfm(F.adaptive_avg_pool2d(x, self.kernel_size)))


@MODELS.register_module()
class AmpDirDynamicDWConv(AdaptiveDynamicDWConv):
    """Eq. 12, decoupled amplitude and direction: dW = Sigmoid(GAP(X) Wa) * D / (||D||_F + eps),
    D = MLP(AAP(X, (K, K))) (the Adaptive predictor), amplitude per channel from ``amp`` = Linear(C, C)."""

    def __init__(self, dim: int, kernel_size: int = 3, eps: float = 1e-6) -> None:
        super().__init__(dim, kernel_size)
        self.amp = nn.Linear(dim, dim)
        self.eps = eps

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        direction = self.wfm(F.adaptive_avg_pool2d(x, self.kernel_size))
        norm = direction.flatten(2).norm(dim=-1)[..., None, None] + self.eps
        return torch.sigmoid(self.amp(x.mean((2, 3))))[..., None, None] * direction / norm


@MODELS.register_module()
class ConvDynamicDWConv(DynamicDWConv):
    """Eq. 13: dW = AAP(f(X), (K, K)), f = 3x3 conv C -> C/ratio -> GELU -> 3x3 conv -> C."""

    def __init__(self, dim: int, kernel_size: int = 3, ratio: int = 4) -> None:
        super().__init__(dim, kernel_size)
        self.wfm = nn.Sequential(nn.Conv2d(dim, dim // ratio, 3, padding=1), nn.GELU(),
                                 nn.Conv2d(dim // ratio, dim, 3, padding=1))

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        return unit_clip(F.adaptive_avg_pool2d(self.wfm(x), self.kernel_size))


@MODELS.register_module()
class StaticDWConv(nn.Conv2d):
    """Static depthwise K x K conv (with bias) on tokens, with the dynamic layers' call signature."""

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return map_to_tokens(super().forward(tokens_to_map(x, hw)))
