"""The per-sample depthwise K x K convolution as Triton kernels on the tokens' layout, a PyTorch custom operator
(``mmwf::per_sample_dwconv``) with its backward, so that eager code and ``torch.compile`` call one kernel that reads
the tokens once per tap from cache and writes the output once: no layout copy, no repeated bias, no B*C groups.

    y[b, h, w, c] = bias[c] + sum_{u, v} x[b, h + u - K//2, w + v - K//2, c] * taps[b, u*K + v, c]   (zero padding)

Tokens x and y are (B, H*W, C) in raster order, taps (B, K*K, C) (a batch stride of 0 shares one kernel over the
batch). The backward: the input's gradient is the same convolution of the output's gradient with the taps flipped;
the taps' gradient is one reduction over the tokens per sample and tap. The reference evaluations stay in
:func:`~.dynamic_dwconv.per_sample_depthwise_conv`, which tests compare these kernels with.
"""
from __future__ import annotations

import contextlib

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - torch's CUDA builds ship triton
    triton = None

__all__ = ['TRITON_AVAILABLE', 'per_sample_dwconv_triton']
TRITON_AVAILABLE = triton is not None


if TRITON_AVAILABLE:
    @triton.jit
    def _dwconv_tokens(x_ptr, w_ptr, b_ptr, y_ptr, H, W, C, stride_wb,
                       K: tl.constexpr, FLIP: tl.constexpr, HAS_BIAS: tl.constexpr, ACC: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
        """One (sample, token block, channel block) of y = conv(x, taps) (FLIP: the taps mirrored, the input's
        gradient); x and y contiguous (B, H*W, C), taps (B, K*K, C) with batch stride ``stride_wb``; sums in ACC."""
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # axis 0: the only one without CUDA's 65535 limit
        b = tl.program_id(1)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        in_c = c < C
        h, w = n // W, n % W
        in_n = n < H * W
        base = b.to(tl.int64) * H * W * C
        acc = tl.zeros([BLOCK_N, BLOCK_C], dtype=ACC)
        for u in tl.static_range(K):
            for v in tl.static_range(K):
                if FLIP:
                    hs, ws = h - (u - K // 2), w - (v - K // 2)
                else:
                    hs, ws = h + (u - K // 2), w + (v - K // 2)
                ok = in_n & (hs >= 0) & (hs < H) & (ws >= 0) & (ws < W)
                src = x_ptr + base + (hs * W + ws)[:, None] * C + c[None, :]
                xs = tl.load(src, mask=ok[:, None] & in_c[None, :], other=0.0).to(ACC)
                tap = tl.load(w_ptr + b.to(tl.int64) * stride_wb + (u * K + v) * C + c, mask=in_c,
                              other=0.0).to(ACC)
                acc += xs * tap[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + c, mask=in_c, other=0.0).to(ACC)[None, :]
        dst = y_ptr + base + n[:, None] * C + c[None, :]
        tl.store(dst, acc.to(y_ptr.dtype.element_ty), mask=in_n[:, None] & in_c[None, :])

    @triton.jit
    def _dwconv_taps_grad(x_ptr, g_ptr, gw_ptr, H, W, C, CHUNK,
                          K: tl.constexpr, KK: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_C: tl.constexpr):
        """One (sample, channel block, chunk of CHUNK tokens) of the taps' gradient: gw[b, chunk, u*K+v, c] =
        sum over the chunk's n of g[b, n, c] x[b, n + shift, c], accumulated in ACC over the tokens in blocks (KK: K*K
        rounded up to a power of two); the chunks are summed after."""
        b = tl.program_id(0)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        chunk = tl.program_id(2)
        in_c = c < C
        base = b.to(tl.int64) * H * W * C
        rows = tl.arange(0, KK)
        acc = tl.zeros([KK, BLOCK_C], dtype=ACC)
        for start in range(chunk * CHUNK, tl.minimum(chunk * CHUNK + CHUNK, H * W), BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            in_n = (n < H * W) & (n < chunk * CHUNK + CHUNK)
            h, w = n // W, n % W
            g = tl.load(g_ptr + base + n[:, None] * C + c[None, :], mask=in_n[:, None] & in_c[None, :],
                        other=0.0).to(ACC)
            for u in tl.static_range(K):
                for v in tl.static_range(K):
                    hs, ws = h + (u - K // 2), w + (v - K // 2)
                    ok = in_n & (hs >= 0) & (hs < H) & (ws >= 0) & (ws < W)
                    xs = tl.load(x_ptr + base + (hs * W + ws)[:, None] * C + c[None, :],
                                 mask=ok[:, None] & in_c[None, :], other=0.0).to(ACC)
                    part = tl.sum(g * xs, axis=0)
                    acc = tl.where(rows[:, None] == u * K + v, acc + part[None, :], acc)
        dst = gw_ptr + (b.to(tl.int64) * tl.num_programs(2) + chunk) * (K * K) * C + rows[:, None] * C + c[None, :]
        tl.store(dst, acc.to(gw_ptr.dtype.element_ty), mask=(rows[:, None] < K * K) & in_c[None, :])


BLOCK_N, BLOCK_C = 32, 64


def _accumulator(dtype: torch.dtype):
    """The kernels' sums: fp64 for fp64 tensors (the equations' tests), else fp32 (bf16 / fp16 inputs too)."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def _on(device: torch.device):
    """Triton launches on the current CUDA device: make it the tensors' for the launch."""
    return torch.cuda.device(device) if device.type == 'cuda' else contextlib.nullcontext()


def _check(x: torch.Tensor, hw: tuple[int, int], taps: torch.Tensor, bias: torch.Tensor | None) -> int:
    """The kernel size K, once the shapes are checked: x (B, H*W, C), taps (B or 1, K*K, C), bias (C)."""
    B, N, C = x.shape
    k = round(taps.shape[1] ** 0.5)
    if N != hw[0] * hw[1] or taps.shape[-1] != C or k * k != taps.shape[1] or taps.shape[0] not in (1, B):
        raise ValueError(f'per_sample_dwconv_triton: tokens {tuple(x.shape)} on grid {tuple(hw)} and taps '
                         f'{tuple(taps.shape)} do not fit: taps are (B or 1, K*K, C)')
    if bias is not None and bias.shape != (C,):
        raise ValueError(f'per_sample_dwconv_triton: bias {tuple(bias.shape)} is not ({C},)')
    return k


def _conv(x: torch.Tensor, hw: tuple[int, int], taps: torch.Tensor, bias: torch.Tensor | None,
          flip: bool) -> torch.Tensor:
    B, N, C = x.shape
    k = _check(x, hw, taps, bias)
    x, taps = x.contiguous(), taps.contiguous()
    y = torch.empty_like(x)
    if y.numel() == 0:
        return y
    grid = (triton.cdiv(N, BLOCK_N), B, triton.cdiv(C, BLOCK_C))
    with _on(x.device):
        _dwconv_tokens[grid](x, taps, taps if bias is None else bias, y, hw[0], hw[1], C,
                             0 if taps.shape[0] == 1 else taps.stride(0), K=k, FLIP=flip, HAS_BIAS=bias is not None,
                             ACC=_accumulator(x.dtype), BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C)
    return y


# programs the taps' gradient aims for (a GPU's multiprocessors several times over): the tokens of a sample are split
# into chunks when the samples and channel blocks alone give fewer
TAPS_GRAD_PROGRAMS = 1024


def _taps_grad(x: torch.Tensor, hw: tuple[int, int], grad: torch.Tensor, k: int) -> torch.Tensor:
    B, N, C = x.shape
    if x.numel() == 0:
        return x.new_zeros(B, k * k, C, dtype=torch.promote_types(x.dtype, torch.float32))
    blocks = triton.cdiv(C, BLOCK_C)
    chunks = max(1, min(triton.cdiv(N, 4 * BLOCK_N), TAPS_GRAD_PROGRAMS // (B * blocks)))
    chunk = triton.cdiv(triton.cdiv(N, chunks), BLOCK_N) * BLOCK_N  # tokens per chunk, whole token blocks
    chunks = triton.cdiv(N, chunk)
    out = torch.empty(B, chunks, k * k, C, device=x.device, dtype=torch.promote_types(x.dtype, torch.float32))
    with _on(x.device):
        _dwconv_taps_grad[(B, blocks, chunks)](x.contiguous(), grad.contiguous(), out, hw[0], hw[1], C, chunk, K=k,
                                               KK=triton.next_power_of_2(k * k), ACC=_accumulator(x.dtype),
                                               BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C)
    return out.sum(1)


@torch.library.custom_op('mmwf::per_sample_dwconv', mutates_args=())
def _per_sample_dwconv(x: torch.Tensor, h: int, w: int, taps: torch.Tensor, bias: torch.Tensor | None,
                       flip: bool = False) -> torch.Tensor:
    return _conv(x, (h, w), taps, bias, flip)


@_per_sample_dwconv.register_fake
def _(x, h, w, taps, bias, flip=False):
    return x.new_empty(x.shape)  # contiguous, as the kernel writes it whatever x's strides


@torch.library.custom_op('mmwf::per_sample_dwconv_taps_grad', mutates_args=())
def _per_sample_dwconv_taps_grad(x: torch.Tensor, h: int, w: int, grad: torch.Tensor, k: int) -> torch.Tensor:
    return _taps_grad(x, (h, w), grad, k)


@_per_sample_dwconv_taps_grad.register_fake
def _(x, h, w, grad, k):
    return x.new_empty(x.shape[0], k * k, x.shape[2], dtype=torch.promote_types(x.dtype, torch.float32))


def _setup_taps_grad(ctx, inputs, output) -> None:
    a, h, w, b, k = inputs
    ctx.save_for_backward(a, b)
    ctx.hw = (h, w)


def _taps_grad_backward(ctx, grad):
    """taps_grad(a, b)[t] = sum_n b[n] a[n + s_t] is bilinear: its gradient in b is the convolution of a with the
    incoming taps, in a the mirrored convolution of b (a second derivative of the layer)."""
    a, b = ctx.saved_tensors
    h, w = ctx.hw
    grad_a = _per_sample_dwconv(b, h, w, grad, None, True) if ctx.needs_input_grad[0] else None
    grad_b = _per_sample_dwconv(a, h, w, grad, None, False) if ctx.needs_input_grad[3] else None
    return grad_a, None, None, grad_b, None


_per_sample_dwconv_taps_grad.register_autograd(_taps_grad_backward, setup_context=_setup_taps_grad)


def _setup_context(ctx, inputs, output) -> None:
    x, h, w, taps, bias, flip = inputs
    ctx.save_for_backward(x, taps)
    ctx.hw, ctx.flip, ctx.bias_dtype = (h, w), flip, None if bias is None else bias.dtype


def _backward(ctx, grad):
    x, taps = ctx.saved_tensors
    (h, w), k = ctx.hw, round(taps.shape[1] ** 0.5)
    grad_x = grad_taps = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = _per_sample_dwconv(grad, h, w, taps, None, not ctx.flip)
    if ctx.needs_input_grad[3]:
        # the taps' gradient pairs g[n] with x[n + shift]; mirrored taps pair them the other way
        gw = _per_sample_dwconv_taps_grad(x, h, w, grad, k) if not ctx.flip else \
            _per_sample_dwconv_taps_grad(grad, h, w, x, k)
        grad_taps = gw.sum(0, keepdim=True) if taps.shape[0] == 1 and x.shape[0] > 1 else gw
        grad_taps = grad_taps.to(taps.dtype)
    if ctx.bias_dtype is not None and ctx.needs_input_grad[4]:  # summed in fp32 at least, kept in the bias's dtype
        grad_bias = grad.sum((0, 1), dtype=torch.promote_types(grad.dtype, torch.float32)).to(ctx.bias_dtype)
    return grad_x, None, None, grad_taps, grad_bias, None


_per_sample_dwconv.register_autograd(_backward, setup_context=_setup_context)


def per_sample_dwconv_triton(x: torch.Tensor, hw: tuple[int, int], taps: torch.Tensor,
                             bias: torch.Tensor | None = None, residual: bool = False) -> torch.Tensor:
    """Tokens x (B, H*W, C) on grid ``hw`` convolved depthwise with per-sample taps (B, K*K, C) (or (1, K*K, C),
    shared by the batch), plus ``bias`` (C), plus x itself when ``residual``: (B, H*W, C), by the Triton kernels (on
    the CPU under ``TRITON_INTERPRET=1``). The residual is the centre tap plus one, in fp32 at least (x + conv(x)
    is conv(x) with that tap), so the kernel adds it in its one pass at no cost; the taps' gradient is unchanged."""
    if not TRITON_AVAILABLE:
        raise RuntimeError('per_sample_dwconv_triton needs triton (it ships with torch\'s CUDA builds)')
    k = _check(x, hw, taps, bias)
    if residual:
        centre = torch.zeros(k * k, 1, dtype=torch.promote_types(taps.dtype, torch.float32), device=taps.device)
        centre[k * k // 2] = 1
        taps = taps + centre
    return _per_sample_dwconv(x, int(hw[0]), int(hw[1]), taps, bias)
