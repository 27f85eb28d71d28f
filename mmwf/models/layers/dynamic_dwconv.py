"""Dynamic depthwise convolutions: W(X) = W0 + dW(X), paper eq. 9, with the predictors of Table 1
(eqs. 10-13).

Every layer maps tokens x (B, H*W, C) on an H x W grid to (B, H*W, C) with a per-sample depthwise K x K
kernel (padding K // 2). Static kernel ``w`` (C, 1, K, K) and bias ``b`` (C), as in the release. The predictors work
on the kernel's taps as tokens, (B, K*K, C): the pooled map is one product over the tokens and the release's 1 x 1
convs are linears on it (:class:`TapConv`), so nothing is copied into another layout before the convolution.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.init import trunc_normal_

from mmwf.registry import MODELS

from .implementation import check_choice, choose_kernel, implementation, records_autograd
from .tokens import map_to_tokens, tokens_to_map


def adaptive_pool_kernel(x: torch.Tensor, impl: str = 'auto') -> str:
    """``'native'``, ``'matrices'`` or ``'tokens'``: :func:`~.implementation.choose_kernel`'s ``'adaptive_pool'``
    for the choice ``impl`` and the map x (B, C, H, W) on its device, with or without autograd."""
    return choose_kernel('adaptive_pool', impl, x.device, records_autograd(x))


def adaptive_avg_pool(x: torch.Tensor, size: int, impl: str = 'auto') -> torch.Tensor:
    """``F.adaptive_avg_pool2d(x, size)`` for maps (B, C, H, W), by :func:`adaptive_pool_kernel`:

    - ``'native'``: PyTorch's op (eager CPU, and under the FLOP counter);
    - ``'matrices'``: two averaging matrices, (size, H) and (size, W) (either ONNX exporter and ``torch.export``:
      ONNX has no adaptive pooling whose output size does not divide the input; :func:`pooling_matrices`);
    - ``'tokens'``: one product of the (size * size, H * W) averaging matrix with the map's tokens (eager CUDA and
      ``torch.compile``: one GEMM reading the map once, free of copies when x is a channels-last view of tokens;
      :func:`pool_tokens_adaptive`). Its result is a channels-last view of the pooled tokens.

    Bin i of a side of n covers [floor(i n / size), ceil((i + 1) n / size)), as PyTorch's."""
    impl = adaptive_pool_kernel(x, impl)
    if impl == 'native':
        return F.adaptive_avg_pool2d(x, size)
    if impl == 'matrices':
        return pooling_matrices(x, size)
    if impl != 'tokens':
        raise ValueError(f"impl must be 'auto', 'native', 'matrices' or 'tokens', got {impl!r}")
    hw = (x.shape[-2], x.shape[-1])
    return tokens_to_map(pool_tokens_adaptive(map_to_tokens(x), hw, size), (size, size))


def averaging_matrix(n: int, size: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(size, n): row i averages adaptive bin i of a side of n (tensor arithmetic, generic in a symbolic n)."""
    i = torch.arange(size, device=device)
    start, end = (i * n) // size, ((i + 1) * n + size - 1) // size
    j = torch.arange(n, device=device)
    mask = (j >= start[:, None]) & (j < end[:, None])
    return mask.to(dtype) / (end - start)[:, None].to(dtype)


def pooling_matrices(x: torch.Tensor, size: int) -> torch.Tensor:
    """:func:`adaptive_avg_pool` as two matrix products with a (size, H) and a (size, W) averaging matrix, the
    large one first (one GEMM over all rows of the maps; ONNX Runtime's Einsum was 3x slower at 64 x 64)."""
    rows = averaging_matrix(x.shape[-2], size, x.device, x.dtype)
    columns = averaging_matrix(x.shape[-1], size, x.device, x.dtype)
    return torch.matmul(rows, torch.matmul(x, columns.t()))


def token_pooling_matrix(hw: tuple[int, int], size: int, device: torch.device, dtype: torch.dtype,
                         keep: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The adaptive pooling to size x size over raster tokens on grid ``hw``, as (averaging, mask, inverse): the
    (size * size, H * W) averaging matrix in ``dtype`` (the Kronecker product of the two sides'
    :func:`averaging_matrix`), its 0/1 mask in ``dtype`` and the bins' inverse token counts (size * size, 1) in fp32
    at least. Built once per grid, device and dtype in eager mode where ``keep`` (plain tensors: the ops that build
    them would be launches of their own), anew otherwise (compiled, exported, tensor subclasses such as fake
    tensors, a CUDA graph being captured)."""
    if keep and implementation() == 'eager' and device.type != 'meta' and not (
            device.type == 'cuda' and torch.cuda.is_current_stream_capturing()):
        return _cached_token_pooling_matrix(int(hw[0]), int(hw[1]), size, device, dtype)
    return _token_pooling_matrix(hw, size, device, dtype)


def _token_pooling_matrix(hw: tuple[int, int], size: int, device: torch.device,
                          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    exact = torch.promote_types(dtype, torch.float32)
    rows, columns = (averaging_matrix(n, size, device, exact) for n in hw)
    averaging = (rows[:, None, :, None] * columns[None, :, None, :]).reshape(size * size, hw[0] * hw[1])
    mask = averaging > 0
    return averaging.to(dtype), mask.to(dtype), 1 / mask.sum(1, keepdim=True).to(exact)


# the grids one process meets (a config's train and test sizes, a benchmark's), per device and dtype
@lru_cache(maxsize=64)
def _cached_token_pooling_matrix(h: int, w: int, size: int, device: torch.device,
                                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with torch.inference_mode(False):  # normal tensors, which autograd can save, also when first built at inference
        return _token_pooling_matrix((h, w), size, device, dtype)


def pool_tokens_adaptive(x: torch.Tensor, hw: tuple[int, int], size: int) -> torch.Tensor:
    """Adaptive average pooling of tokens x (B, H*W, C) on grid ``hw`` to size x size: (B, size * size, C), as one
    product with the averaging matrix of :func:`token_pooling_matrix` (broadcast over the batch: no copy of x). Where
    the product runs in fp16 / bf16 (such tokens, or autocast), whose 1 / count would bias every bin, the tokens of
    each bin are summed by the 0/1 mask and divided by the count in fp32."""
    averaging, mask, inverse = token_pooling_matrix(hw, size, x.device, x.dtype, keep=type(x) is torch.Tensor)
    if x.dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled(x.device.type):
        return (torch.matmul(mask, x) * inverse).to(x.dtype)
    return torch.matmul(averaging, x)


def per_sample_depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                              impl: str = 'auto') -> torch.Tensor:
    """Depthwise K x K convolution ('same' zero padding) with a kernel per sample: x (B, C, H, W), weight
    (B, C, K, K), bias (C) -> (B, C, H, W). One operation, five evaluations, chosen by
    :func:`~.implementation.choose_kernel` for the choice ``impl`` (``'auto'``: by the table, on x's device):

    - ``'loop'`` (eager CPU inference): one depthwise conv per sample on the channels-last views, the fastest there;
    - ``'grouped'`` (eager CUDA, eager CPU training, TorchScript tracing for the FLOP counter, and exported graphs
      whose batch is static): one grouped conv over the batch folded into the channels (B*C groups), one kernel
      launch for the whole batch (on the CPU its backward is about twice as fast as the loop's); without autograd
      the bias is added in the pass that writes the result in x's memory format (channels-last for tokens);
    - ``'taps'`` (exported graphs with a dynamic batch, and the TorchScript exporter, whose traced graph keeps the
      trace's batch: a group count cannot depend on B): a static depthwise conv with one-hot kernels writes the K*K
      shifted maps, and one batched matrix product weighs them with the kernel taps;
    - ``'shift'`` (``torch.compile``, which fuses it into one kernel): the sum of the K*K shifted maps times their
      kernel taps, element-wise ops generic in B, H and W;
    - ``'triton'`` (a choice, not yet the rule's: no GPU has timed it): one Triton kernel on the tokens' layout, its
      backward two (:mod:`.dwconv_triton`; on the CPU under ``TRITON_INTERPRET=1``); traced and exported graphs
      take their own entry instead.
    """
    impl = choose_kernel('depthwise_conv', impl, x.device, records_autograd(x, weight), batch=x.shape[0])
    if impl == 'triton':  # one kernel on the tokens' layout and the taps (layers/dwconv_triton.py)
        from .dwconv_triton import per_sample_dwconv_triton
        taps, hw = weight.flatten(2).transpose(1, 2), (x.shape[-2], x.shape[-1])
        return tokens_to_map(per_sample_dwconv_triton(map_to_tokens(x), hw, taps, bias), hw)
    return evaluate_depthwise_conv(impl, x, weight, bias)


def evaluate_depthwise_conv(impl: str, x: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`per_sample_depthwise_conv` by the chosen kernel ``impl`` (``'loop'``, ``'grouped'``, ``'taps'`` or
    ``'shift'``), for a layer that asked :func:`~.implementation.choose_kernel` itself: x (B, C, H, W), weight
    (B, C, K, K), bias (C) -> (B, C, H, W)."""
    B, C, H, W = x.shape
    k = weight.shape[-1]
    if impl == 'loop':
        return torch.cat([F.conv2d(x[i:i + 1], weight[i].unsqueeze(1), bias, padding=k // 2, groups=C)
                          for i in range(B)])
    if impl == 'grouped':
        # eager without autograd (out= records none; graphs are kept free of out=): the bias is added in the pass that
        # writes the result in x's memory format
        fused = implementation() == 'eager' and not records_autograd(x, weight, *([] if bias is None else [bias]))
        y = F.conv2d(x.reshape(1, B * C, H, W), weight.reshape(B * C, 1, k, k),
                     None if bias is None or fused else bias.repeat(B), padding=k // 2, groups=B * C)
        y = y.view(B, C, H, W)
        if not fused or (bias is None and x.is_contiguous()):
            return y
        out = torch.empty_like(x, dtype=y.dtype)  # channels-last for a view of tokens: map_to_tokens is then free
        return out.copy_(y) if bias is None else torch.add(y, bias.to(y.dtype).view(1, C, 1, 1), out=out)
    p = k // 2
    if impl == 'taps':
        eye = torch.eye(k * k, dtype=x.dtype, device=x.device).view(k * k, 1, k, k).repeat(C, 1, 1, 1)
        # sizes from the tensors, not Python ints, so that a traced graph keeps them dynamic
        taps = F.conv2d(x, eye, padding=p, groups=C).unflatten(1, (C, k * k)).flatten(3)  # the K*K shifted maps
        y = torch.matmul(weight.flatten(2).unsqueeze(2), taps).view_as(x)
        return y if bias is None else y + bias.view(1, C, 1, 1)
    if impl != 'shift':
        raise ValueError(f"impl must be 'auto', 'loop', 'grouped', 'taps', 'shift' or 'triton', got {impl!r}")
    xp = F.pad(x, (p, p, p, p))
    y = xp[:, :, :H, :W] * weight[:, :, :1, :1]
    for u in range(k):
        for v in range(k):
            if u or v:
                y = y + xp[:, :, u:u + H, v:v + W] * weight[:, :, u:u + 1, v:v + 1]
    return y if bias is None else y + bias.view(1, C, 1, 1)


def unit_clip(taps: torch.Tensor) -> torch.Tensor:
    """dW / (||dW||_F over the K x K kernel + 1), the release's normalisation of an update given as taps
    (B, K*K, C)."""
    return taps / (torch.linalg.vector_norm(taps, dim=1, keepdim=True) + 1)


class TapConv(nn.Conv2d):
    """The release's 1 x 1 conv of a predictor (its keys and shapes: weight (Cout, Cin, 1, 1)) applied to taps as
    tokens (B, K*K, Cin) -> (B, K*K, Cout): a linear, one GEMM, where the conv on a K x K map is a launch of the
    convolution engine and layout copies."""

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True) -> None:
        super().__init__(in_channels, out_channels, 1, bias=bias)

    def forward(self, taps: torch.Tensor) -> torch.Tensor:
        return F.linear(taps, self.weight.flatten(1), self.bias)


class DynamicDWConv(nn.Module):
    """Base class: per-sample depthwise conv with kernel w + dW(X). Subclasses implement the equation's dW as taps
    (:meth:`delta_taps`, from tokens) or as a kernel (:meth:`delta`, from the map); each is derived from the other.
    The kernel adds its normalised form (:meth:`normalise`), as the dynamic linears do.

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

    def delta_taps(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """The equation's dW as taps (B, K*K, C), predicted from tokens x (B, H*W, C) on grid ``hw``."""
        if type(self).delta is DynamicDWConv.delta:
            raise NotImplementedError(f'{type(self).__name__} implements neither delta_taps nor delta')
        return map_to_tokens(self.delta(tokens_to_map(x, hw)))

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """The equation's dW as a kernel (B, C, K, K), predicted from the map x (B, C, H, W)."""
        if type(self).delta_taps is DynamicDWConv.delta_taps:
            raise NotImplementedError(f'{type(self).__name__} implements neither delta_taps nor delta')
        k = self.kernel_size
        return tokens_to_map(self.delta_taps(map_to_tokens(x), (x.shape[-2], x.shape[-1])), (k, k))

    def normalise(self, taps: torch.Tensor) -> torch.Tensor:
        """dW as taps (B, K*K, C) -> the update added to ``w``: the release's :func:`unit_clip`."""
        return unit_clip(taps)

    def effective_delta(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """The update added to ``w`` for tokens x (B, H*W, C): (B, C, K, K)."""
        k = self.kernel_size
        return tokens_to_map(self.normalise(self.delta_taps(x, hw)), (k, k))

    def forward(self, x: torch.Tensor, hw: tuple[int, int], residual: bool = False) -> torch.Tensor:
        """Tokens x (B, H*W, C) -> the convolution (B, H*W, C), plus x when ``residual`` (a block's shortcut: in
        the Triton kernel's one pass, else one add)."""
        k = self.kernel_size
        taps = self.w.view(self.dim, k * k).t() + self.normalise(self.delta_taps(x, hw))  # (B, K*K, C)
        impl = choose_kernel('depthwise_conv', self.conv, x.device, records_autograd(x, taps), batch=x.shape[0])
        if impl == 'triton':  # one kernel on the tokens and the taps (layers/dwconv_triton.py)
            from .dwconv_triton import per_sample_dwconv_triton
            return per_sample_dwconv_triton(x, hw, taps, self.b, residual)
        weight = tokens_to_map(taps, (k, k))  # (B, C, K, K)
        return add_shortcut(map_to_tokens(evaluate_depthwise_conv(impl, tokens_to_map(x, hw), weight, self.b)), x,
                            residual)

    def extra_repr(self) -> str:
        return f'dim={self.dim}, kernel_size={self.kernel_size}'


@MODELS.register_module()
class GAPDynamicDWConv(DynamicDWConv):
    """Eq. 10: dW = reshape(MLP(GAP(X))), MLP = Linear(C, C) -> GELU -> Linear(C, C*K*K)."""

    def __init__(self, dim: int, kernel_size: int = 3, **choices: str) -> None:
        super().__init__(dim, kernel_size, **choices)
        self.wfm = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim * kernel_size ** 2))

    def delta_taps(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return self.wfm(x.mean(1)).view(-1, self.dim, self.kernel_size ** 2).transpose(1, 2)


@MODELS.register_module()
class AdaptiveDynamicDWConv(DynamicDWConv):
    """Eq. 11, Spatially Adaptive (released): dW = MLP(AAP(X, (K, K))), MLP = 1x1 conv (bias) -> GELU ->
    1x1 conv (no bias) as ``wfm.0`` / ``wfm.2`` (:class:`TapConv`, linears on the pooled taps)."""

    def __init__(self, dim: int, kernel_size: int = 3, **choices: str) -> None:
        super().__init__(dim, kernel_size, **choices)
        self.wfm = nn.Sequential(TapConv(dim, dim), nn.GELU(), TapConv(dim, dim, bias=False))

    def pooled_taps(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """AAP(X, (K, K)) as taps (B, K*K, C)."""
        return map_to_tokens(adaptive_avg_pool(tokens_to_map(x, hw), self.kernel_size, self.pool))

    def delta_taps(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return self.wfm(self.pooled_taps(x, hw))


@MODELS.register_module()
class AmpDirDynamicDWConv(AdaptiveDynamicDWConv):
    """Eq. 12, decoupled amplitude and direction: dW = Sigmoid(GAP(X) Wa) * D / (||D||_F + eps),
    D = MLP(AAP(X, (K, K))) (the Adaptive predictor), amplitude per channel from ``amp`` = Linear(C, C)."""

    def __init__(self, dim: int, kernel_size: int = 3, eps: float = 1e-6, **choices: str) -> None:
        super().__init__(dim, kernel_size, **choices)
        self.amp = nn.Linear(dim, dim)
        self.eps = eps

    def delta_taps(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        direction = self.wfm(self.pooled_taps(x, hw))
        norm = torch.linalg.vector_norm(direction, dim=1, keepdim=True) + self.eps
        return torch.sigmoid(self.amp(x.mean(1))).unsqueeze(1) * direction / norm

    def normalise(self, taps: torch.Tensor) -> torch.Tensor:
        """Eq. 12's dW is bounded by construction (amplitude in (0, 1) times a unit direction): added as it is."""
        return taps


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
    """Static depthwise K x K conv (with bias) on tokens, with the dynamic layers' call signature.

    Args:
        dim (int): channels C.
        kernel_size (int): K. Defaults to 3.
        conv (str): ``'triton'``, the per-sample conv's Triton kernel with the one kernel shared by the batch (a
            choice, not yet the rule's: no GPU has timed it; traced and exported graphs take nn.Conv2d); any other
            value, nn.Conv2d (the per-sample evaluations have one form for a static kernel). Defaults to ``'auto'``.
    """

    choices = ('conv',)

    def __init__(self, dim: int, kernel_size: int = 3, conv: str = 'auto') -> None:
        super().__init__(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        self.conv = check_choice('conv', conv)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], residual: bool = False) -> torch.Tensor:
        """Tokens x (B, H*W, C) -> the convolution (B, H*W, C), plus x when ``residual``."""
        # 'triton' where the running implementation takes mmwf's kernels (choose_kernel), else nn.Conv2d
        if self.conv == 'triton' and choose_kernel('depthwise_conv', self.conv) == 'triton':
            from .dwconv_triton import per_sample_dwconv_triton
            taps = self.weight.view(self.out_channels, -1).t().unsqueeze(0)  # (1, K*K, C): stride 0 over the batch
            return per_sample_dwconv_triton(x, hw, taps, self.bias, residual)
        return add_shortcut(map_to_tokens(super().forward(tokens_to_map(x, hw))), x, residual)


def add_shortcut(y: torch.Tensor, x: torch.Tensor, residual: bool) -> torch.Tensor:
    """y + x where ``residual`` (in place on y, a layer's fresh output, where autograd does not record it), else y."""
    if not residual:
        return y
    return y + x if records_autograd(y, x) else y.add_(x)
