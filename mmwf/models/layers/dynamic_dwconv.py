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

from .implementation import check_choice, kernel, records_autograd
from .tokens import map_to_tokens, tokens_to_map

# the map size (H * W) from which eager CUDA inference pools by the matrices: on an H200 a WF-T forward was 1.44x /
# 1.50x faster at 1024 / 1248 px (64 x 64 / 78 x 78 maps, batch 8) and 0.93x / 0.81x at 512 / 224 (32 x 32, 14 x 14)
LARGE_MAP = 64 * 64


def adaptive_pool_kernel(x: torch.Tensor, impl: str = 'auto') -> str:
    """``'native'`` or ``'matrices'``: ``impl``, or for ``'auto'`` the :func:`~.implementation.kernel` of
    ``'adaptive_pool'`` for the map x, ``'matrices-large'`` resolved by x's size (:data:`LARGE_MAP`)."""
    if impl != 'auto':
        return impl
    impl = kernel('adaptive_pool', x.device, records_autograd(x))
    if impl == 'matrices-large':
        return 'matrices' if x.shape[-2] * x.shape[-1] >= LARGE_MAP else 'native'
    return impl


def adaptive_avg_pool(x: torch.Tensor, size: int, impl: str = 'auto') -> torch.Tensor:
    """``F.adaptive_avg_pool2d(x, size)`` for maps (B, C, H, W), by :func:`adaptive_pool_kernel`: PyTorch's op
    (``'native'``: eager, and under the FLOP counter) or two averaging matrices (``'matrices'``: eager CUDA inference
    on large maps, where PyTorch's kernel is slow, compiling, ``torch.export`` and either ONNX exporter; bin i of a
    side of n covers [floor(i n / size), ceil((i + 1) n / size)), as PyTorch's): ONNX has no adaptive pooling whose
    output size does not divide the input, and the matrices are generic in H and W."""
    if adaptive_pool_kernel(x, impl) == 'native':
        return F.adaptive_avg_pool2d(x, size)
    return pooling_matrices(x, size)


def pooling_matrices(x: torch.Tensor, size: int) -> torch.Tensor:
    """:func:`adaptive_avg_pool` as two matrix products with a (size, H) and a (size, W) averaging matrix, the
    large one first (one GEMM over all rows of the maps; ONNX Runtime's Einsum was 3x slower at 64 x 64)."""
    def bins(n: int) -> torch.Tensor:  # (size, n): row i averages bin i
        i = torch.arange(size, device=x.device)
        start, end = (i * n) // size, ((i + 1) * n + size - 1) // size
        j = torch.arange(n, device=x.device)
        mask = (j >= start[:, None]) & (j < end[:, None])
        return mask.to(x.dtype) / (end - start)[:, None].to(x.dtype)
    return torch.matmul(bins(x.shape[-2]), torch.matmul(x, bins(x.shape[-1]).t()))


def per_sample_depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                              impl: str = 'auto') -> torch.Tensor:
    """Depthwise K x K convolution ('same' zero padding) with a kernel per sample: x (B, C, H, W), weight
    (B, C, K, K), bias (C) -> (B, C, H, W). One operation, four evaluations, chosen by ``impl`` (``'auto'``: the
    :func:`~.implementation.kernel` of ``'depthwise_conv'`` on x's device):

    - ``'loop'`` (eager CPU inference): one depthwise conv per sample on the channels-last views, the fastest there;
    - ``'grouped'`` (eager CUDA, eager CPU training, TorchScript tracing for the FLOP counter, and exported graphs
      whose batch is static): one grouped conv over the batch folded into the channels (B*C groups), one kernel
      launch for the whole batch (on the CPU its backward is about twice as fast as the loop's);
    - ``'taps'`` (exported graphs with a dynamic batch, and the TorchScript exporter, whose traced graph keeps the
      trace's batch: a group count cannot depend on B): a static depthwise conv with one-hot kernels writes the K*K
      shifted maps, and one batched matrix product weighs them with the kernel taps;
    - ``'shift'`` (``torch.compile``, which fuses it into one kernel): the sum of the K*K shifted maps times their
      kernel taps, element-wise ops generic in B, H and W.
    """
    B, C, H, W = x.shape
    k = weight.shape[-1]
    if impl == 'auto':
        impl = kernel('depthwise_conv', x.device, records_autograd(x, weight))
        if impl == 'grouped-static':  # a symbolic batch (torch.export's dynamic dims) is not an int
            impl = 'grouped' if isinstance(B, int) else 'taps'
    if impl == 'loop':
        return torch.cat([F.conv2d(x[i:i + 1], weight[i].unsqueeze(1), bias, padding=k // 2, groups=C)
                          for i in range(B)])
    if impl == 'grouped':
        y = F.conv2d(x.reshape(1, B * C, H, W), weight.reshape(B * C, 1, k, k),
                     None if bias is None else bias.repeat(B), padding=k // 2, groups=B * C)
        return y.view(B, C, H, W)
    p = k // 2
    if impl == 'taps':
        eye = torch.eye(k * k, dtype=x.dtype, device=x.device).view(k * k, 1, k, k).repeat(C, 1, 1, 1)
        # sizes from the tensors, not Python ints, so that a traced graph keeps them dynamic
        taps = F.conv2d(x, eye, padding=p, groups=C).unflatten(1, (C, k * k)).flatten(3)  # the K*K shifted maps
        y = torch.matmul(weight.flatten(2).unsqueeze(2), taps).view_as(x)
        return y if bias is None else y + bias.view(1, C, 1, 1)
    if impl != 'shift':
        raise ValueError(f"impl must be 'auto', 'loop', 'grouped', 'taps' or 'shift', got {impl!r}")
    xp = F.pad(x, (p, p, p, p))
    y = xp[:, :, :H, :W] * weight[:, :, :1, :1]
    for u in range(k):
        for v in range(k):
            if u or v:
                y = y + xp[:, :, u:u + H, v:v + W] * weight[:, :, u:u + 1, v:v + 1]
    return y if bias is None else y + bias.view(1, C, 1, 1)


def unit_clip(dw: torch.Tensor) -> torch.Tensor:
    """dW / (||dW||_F over the K x K kernel + 1), the release's normalisation of a (B, C, K, K) update."""
    return dw / (dw.flatten(2).norm(dim=-1)[..., None, None] + 1)


class DynamicDWConv(nn.Module):
    """Base class: per-sample depthwise conv with kernel w + dW(X). Subclasses implement :meth:`delta`, the
    equation's dW; the kernel adds its normalised form (:meth:`effective_delta`), as the dynamic linears do.

    Args:
        dim (int): channels C.
        kernel_size (int): K. Defaults to 3.
        conv (str): the per-sample depthwise conv's evaluation (:func:`per_sample_depthwise_conv`). Defaults to
            ``'auto'``.
        pool (str): the predictors' adaptive pooling (:func:`adaptive_avg_pool`). Defaults to ``'auto'``.
    """

    choices = ('conv', 'pool')

    def __init__(self, dim: int, kernel_size: int = 3, conv: str = 'auto', pool: str = 'auto') -> None:
        super().__init__()
        self.dim, self.kernel_size = dim, kernel_size
        self.conv, self.pool = check_choice('conv', conv), check_choice('pool', pool)
        self.w = nn.Parameter(trunc_normal_(torch.empty(dim, 1, kernel_size, kernel_size), std=0.02))
        self.b = nn.Parameter(trunc_normal_(torch.empty(dim), std=0.02))

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """Predict the equation's dW (B, C, K, K) from the map x (B, C, H, W)."""
        raise NotImplementedError

    def normalise(self, dw: torch.Tensor) -> torch.Tensor:
        """dW -> the update added to ``w``: the release's :func:`unit_clip`."""
        return unit_clip(dw)

    def effective_delta(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """The update added to ``w`` for tokens x (B, H*W, C): (B, C, K, K)."""
        return self.normalise(self.delta(tokens_to_map(x, hw)))

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = tokens_to_map(x, hw)
        weight = self.w.squeeze(1) + self.normalise(self.delta(x))  # (B, C, K, K)
        return map_to_tokens(per_sample_depthwise_conv(x, weight, self.b, self.conv))

    def extra_repr(self) -> str:
        return f'dim={self.dim}, kernel_size={self.kernel_size}'


@MODELS.register_module()
class GAPDynamicDWConv(DynamicDWConv):
    """Eq. 10: dW = reshape(MLP(GAP(X))), MLP = Linear(C, C) -> GELU -> Linear(C, C*K*K)."""

    def __init__(self, dim: int, kernel_size: int = 3, **choices: str) -> None:
        super().__init__(dim, kernel_size, **choices)
        self.wfm = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim * kernel_size ** 2))

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kernel_size
        return self.wfm(x.mean((2, 3))).view(-1, self.dim, k, k)


@MODELS.register_module()
class AdaptiveDynamicDWConv(DynamicDWConv):
    """Eq. 11, Spatially Adaptive (released): dW = MLP(AAP(X, (K, K))), MLP = 1x1 conv (bias) -> GELU ->
    1x1 conv (no bias) as ``wfm.0`` / ``wfm.2``."""

    def __init__(self, dim: int, kernel_size: int = 3, **choices: str) -> None:
        super().__init__(dim, kernel_size, **choices)
        self.wfm = nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU(), nn.Conv2d(dim, dim, 1, bias=False))

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        return self.wfm(adaptive_avg_pool(x, self.kernel_size, self.pool))


@MODELS.register_module()
class AmpDirDynamicDWConv(AdaptiveDynamicDWConv):
    """Eq. 12, decoupled amplitude and direction: dW = Sigmoid(GAP(X) Wa) * D / (||D||_F + eps),
    D = MLP(AAP(X, (K, K))) (the Adaptive predictor), amplitude per channel from ``amp`` = Linear(C, C)."""

    def __init__(self, dim: int, kernel_size: int = 3, eps: float = 1e-6, **choices: str) -> None:
        super().__init__(dim, kernel_size, **choices)
        self.amp = nn.Linear(dim, dim)
        self.eps = eps

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        direction = self.wfm(adaptive_avg_pool(x, self.kernel_size, self.pool))
        norm = direction.flatten(2).norm(dim=-1)[..., None, None] + self.eps
        return torch.sigmoid(self.amp(x.mean((2, 3))))[..., None, None] * direction / norm

    def normalise(self, dw: torch.Tensor) -> torch.Tensor:
        """Eq. 12's dW is bounded by construction (amplitude in (0, 1) times a unit direction): added as it is."""
        return dw


@MODELS.register_module()
class ConvDynamicDWConv(DynamicDWConv):
    """Eq. 13: dW = AAP(f(X), (K, K)), f = 3x3 conv C -> C/ratio -> GELU -> 3x3 conv -> C."""

    def __init__(self, dim: int, kernel_size: int = 3, ratio: int = 4, **choices: str) -> None:
        super().__init__(dim, kernel_size, **choices)
        self.wfm = nn.Sequential(nn.Conv2d(dim, dim // ratio, 3, padding=1), nn.GELU(),
                                 nn.Conv2d(dim // ratio, dim, 3, padding=1))

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        return adaptive_avg_pool(self.wfm(x), self.kernel_size, self.pool)


@MODELS.register_module()
class StaticDWConv(nn.Conv2d):
    """Static depthwise K x K conv (with bias) on tokens, with the dynamic layers' call signature."""

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return map_to_tokens(super().forward(tokens_to_map(x, hw)))
