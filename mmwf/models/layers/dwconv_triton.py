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

import torch

from .triton_utils import INTERPRETED, TRITON_AVAILABLE, accumulator, launch_device, pointer_type

if TRITON_AVAILABLE:
    import triton
    import triton.language as tl

__all__ = ['TRITON_AVAILABLE', 'per_sample_dwconv_triton']


if TRITON_AVAILABLE:
    @triton.jit
    def _dwconv_tokens(x_ptr, w_ptr, b_ptr, y_ptr, H, W, C, stride_wb,
                       KS: tl.constexpr, FLIP: tl.constexpr, HAS_BIAS: tl.constexpr, ACC: tl.constexpr,
                       BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        """One (token block, sample, channel block) of y = conv(x, taps) (FLIP: the taps mirrored, the input's
        gradient); x and y contiguous (B, H*W, C), taps (B, KS*KS, C) with batch stride ``stride_wb``; sums in ACC.
        The taps are two loops, not unrolled: a thread holds one tap's tile at a time (unrolled, all KS*KS loads were
        hoisted and K = 5 and 7 spilled 4 to 8 KB a thread on sm_90a; KS unrolled columns still spilled a few
        bytes); the GPU hides the loads' latency across its many resident programs instead."""
        n = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # axis 0: the only one without CUDA's 65535 limit
        b = tl.program_id(1).to(tl.int64)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        in_c = c < C
        h, w = n // W, n % W
        in_n = n < H * W
        x_base = x_ptr + b * H * W * C
        w_base = w_ptr + b * stride_wb
        sign = -1 if FLIP else 1
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=ACC)
        for u in range(KS):
            hs = h + sign * (u - KS // 2)
            row_ok = in_n & (hs >= 0) & (hs < H)
            for v in range(KS):
                ws = w + sign * (v - KS // 2)
                ok = row_ok & (ws >= 0) & (ws < W)
                xs = tl.load(x_base + (hs * W + ws)[:, None] * C + c[None, :], mask=ok[:, None] & in_c[None, :],
                             other=0.0).to(ACC)
                tap = tl.load(w_base + (u * KS + v) * C + c, mask=in_c, other=0.0).to(ACC)
                acc += xs * tap[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + c, mask=in_c, other=0.0).to(ACC)[None, :]
        tl.store(y_ptr + b * H * W * C + n[:, None] * C + c[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=in_n[:, None] & in_c[None, :])

    @triton.jit
    def _dwconv_taps_grad(x_ptr, g_ptr, gw_ptr, H, W, C, CHUNK,
                          KS: tl.constexpr, TAPS: tl.constexpr, ACC: tl.constexpr, BLOCK_C: tl.constexpr):
        """One (sample, channel block, chunk of CHUNK tokens) of the taps' gradient: gw[b, chunk, u*KS+v, c] =
        sum over the chunk's n of g[b, n, c] x[b, n + shift, c]. A program holds every tap's sum for its channels
        (TAPS rows: KS*KS rounded up to a power of two) and walks the chunk token by token, adding g[n] times x at
        the KS*KS shifts of n: the sum over the tokens is the loop, elementwise per tap, with no reduction across
        threads (a reduction per tap and 32-token step took 49 cross-warp reductions a step at K = 7) and x's rows
        read again from L1 for the next token; the chunks are summed after."""
        b = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        chunk = tl.program_id(2)
        in_c = c < C
        x_base = x_ptr + b * H * W * C
        g_base = g_ptr + b * H * W * C
        taps = tl.arange(0, TAPS)
        du, dv = taps // KS - KS // 2, taps % KS - KS // 2
        is_tap = taps < KS * KS
        acc = tl.zeros([TAPS, BLOCK_C], dtype=ACC)
        for n in range(chunk * CHUNK, tl.minimum(chunk * CHUNK + CHUNK, H * W)):
            hs, ws = n // W + du, n % W + dv
            ok = is_tap & (hs >= 0) & (hs < H) & (ws >= 0) & (ws < W)
            xs = tl.load(x_base + (n + du * W + dv)[:, None] * C + c[None, :], mask=ok[:, None] & in_c[None, :],
                         other=0.0)
            g = tl.load(g_base + n * C + c, mask=in_c, other=0.0)
            acc += xs.to(ACC) * g.to(ACC)[None, :]
        dst = gw_ptr + (b * tl.num_programs(2) + chunk) * (KS * KS) * C + taps[:, None] * C + c[None, :]
        tl.store(dst, acc.to(gw_ptr.dtype.element_ty), mask=is_tap[:, None] & in_c[None, :])


BLOCK_T, BLOCK_C = 32, 64  # tokens, channels of a program
NUM_WARPS = 4


def check_device(x: torch.Tensor, choice: str, others: str) -> None:
    """Refuse tensors on the CPU without Triton's interpreter, naming the layer ``choice`` that calls the kernels and
    the ``others`` to choose: Triton has no CPU driver and would stop deep in its launcher ("0 active drivers"). At
    the call, where the device is known: a layer is built on the CPU and moved to its device later."""
    if x.device.type == 'cpu' and not INTERPRETED:
        raise RuntimeError(f'{choice} runs a Triton kernel: on a CUDA GPU, or on the CPU under Triton\'s interpreter '
                           '(TRITON_INTERPRET=1 set before mmwf is imported: the tests); got tensors on the CPU '
                           f'without it. Move the model to a GPU, or choose {others}')


def _check_conv(x: torch.Tensor, hw: tuple[int, int], taps: torch.Tensor, bias: torch.Tensor | None) -> int:
    """The kernel size KS, once the shapes are checked: x (B, H*W, C), taps (B or 1, KS*KS, C), bias (C)."""
    B, N, C = x.shape
    ks = round(taps.shape[1] ** 0.5)
    if N != hw[0] * hw[1] or taps.shape[-1] != C or ks * ks != taps.shape[1] or taps.shape[0] not in (1, B):
        raise ValueError(f'per_sample_dwconv_triton: tokens {tuple(x.shape)} on grid {tuple(hw)} and taps '
                         f'{tuple(taps.shape)} do not fit: taps are (B or 1, K*K, C)')
    if bias is not None and bias.shape != (C,):
        raise ValueError(f'per_sample_dwconv_triton: bias {tuple(bias.shape)} is not ({C},)')
    return ks


def _conv(x: torch.Tensor, hw: tuple[int, int], taps: torch.Tensor, bias: torch.Tensor | None,
          flip: bool) -> torch.Tensor:
    B, N, C = x.shape
    ks = _check_conv(x, hw, taps, bias)
    x, taps = x.contiguous(), taps.contiguous()
    y = torch.empty_like(x)
    if y.numel() == 0:
        return y
    grid = (triton.cdiv(N, BLOCK_T), B, triton.cdiv(C, BLOCK_C))
    with launch_device(x.device):
        _dwconv_tokens[grid](x, taps, taps if bias is None else bias, y, hw[0], hw[1], C,
                             0 if taps.shape[0] == 1 else taps.stride(0), KS=ks, FLIP=flip, HAS_BIAS=bias is not None,
                             ACC=accumulator(x.dtype), BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)
    return y


# programs the taps' gradient aims for (a GPU's multiprocessors several times over): the tokens of a sample are split
# into chunks when the samples and channel blocks alone give fewer
TAPS_GRAD_PROGRAMS = 1024


def _taps_grad(x: torch.Tensor, hw: tuple[int, int], grad: torch.Tensor, ks: int) -> torch.Tensor:
    B, N, C = x.shape
    if x.numel() == 0:
        return x.new_zeros(B, ks * ks, C, dtype=torch.promote_types(x.dtype, torch.float32))
    blocks = triton.cdiv(C, BLOCK_C)
    chunks = max(1, min(triton.cdiv(N, 4 * BLOCK_T), TAPS_GRAD_PROGRAMS // (B * blocks)))
    chunk = triton.cdiv(triton.cdiv(N, chunks), BLOCK_T) * BLOCK_T  # tokens per chunk, whole token blocks
    chunks = triton.cdiv(N, chunk)
    out = torch.empty(B, chunks, ks * ks, C, device=x.device, dtype=torch.promote_types(x.dtype, torch.float32))
    with launch_device(x.device):
        _dwconv_taps_grad[(B, blocks, chunks)](x.contiguous(), grad.contiguous(), out, hw[0], hw[1], C, chunk, KS=ks,
                                               TAPS=triton.next_power_of_2(ks * ks), ACC=accumulator(x.dtype),
                                               BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)
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


def _setup_conv(ctx, inputs, output) -> None:
    x, h, w, taps, bias, flip = inputs
    ctx.save_for_backward(x, taps)
    ctx.hw, ctx.flip, ctx.bias_dtype = (h, w), flip, None if bias is None else bias.dtype


def _conv_backward(ctx, grad):
    x, taps = ctx.saved_tensors
    (h, w), ks = ctx.hw, round(taps.shape[1] ** 0.5)
    grad_x = grad_taps = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = _per_sample_dwconv(grad, h, w, taps, None, not ctx.flip)
    if ctx.needs_input_grad[3]:
        # the taps' gradient pairs g[n] with x[n + shift]; mirrored taps pair them the other way
        gw = _per_sample_dwconv_taps_grad(x, h, w, grad, ks) if not ctx.flip else \
            _per_sample_dwconv_taps_grad(grad, h, w, x, ks)
        grad_taps = gw.sum(0, keepdim=True) if taps.shape[0] == 1 and x.shape[0] > 1 else gw
        grad_taps = grad_taps.to(taps.dtype)
    if ctx.bias_dtype is not None and ctx.needs_input_grad[4]:  # summed in fp32 at least, kept in the bias's dtype
        grad_bias = grad.sum((0, 1), dtype=torch.promote_types(grad.dtype, torch.float32)).to(ctx.bias_dtype)
    return grad_x, None, None, grad_taps, grad_bias, None


_per_sample_dwconv.register_autograd(_conv_backward, setup_context=_setup_conv)


def per_sample_dwconv_triton(x: torch.Tensor, hw: tuple[int, int], taps: torch.Tensor,
                             bias: torch.Tensor | None = None, residual: bool = False) -> torch.Tensor:
    """Tokens x (B, H*W, C) on grid ``hw`` convolved depthwise with per-sample taps (B, K*K, C) (or (1, K*K, C),
    shared by the batch), plus ``bias`` (C), plus x itself when ``residual``: (B, H*W, C), by the Triton kernels (on
    the CPU under ``TRITON_INTERPRET=1``). The residual is the centre tap plus one, in fp32 at least (x + conv(x)
    is conv(x) with that tap), so the kernel adds it in its one pass at no cost; the taps' gradient is unchanged."""
    if not TRITON_AVAILABLE:
        raise RuntimeError('per_sample_dwconv_triton needs triton (it ships with torch\'s CUDA builds)')
    check_device(x, "conv='triton' (per_sample_dwconv_triton)", "conv='auto' (or 'loop', 'grouped', 'taps', 'shift')")
    ks = _check_conv(x, hw, taps, bias)
    if residual:
        centre = torch.zeros(ks * ks, 1, dtype=torch.promote_types(taps.dtype, torch.float32), device=taps.device)
        centre[ks * ks // 2] = 1
        taps = taps + centre
    return _per_sample_dwconv(x, int(hw[0]), int(hw[1]), taps, bias)


def aot_specializations() -> list:
    """The kernels' specializations the layers reach, for :mod:`.triton_targets`: K 3, 5 and 7 with tokens in
    fp32, bf16 or fp16 and fp32 taps and bias (a layer's parameters; under autocast its tokens are bf16 / fp16):
    the convolution forward (with the bias) and mirrored (the input's gradient, no bias), and the taps' gradient."""
    from .triton_targets import spec
    found, name = [], __name__
    for ks in (3, 5, 7):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            tokens, label = pointer_type(dtype), pointer_type(dtype)[1:]
            conv_args = dict(x_ptr=tokens, w_ptr='*fp32', b_ptr='*fp32', y_ptr=tokens, H='i32', W='i32', C='i32',
                             stride_wb='i32', KS='constexpr', FLIP='constexpr', HAS_BIAS='constexpr',
                             ACC='constexpr', BLOCK_T='constexpr', BLOCK_C='constexpr')
            for what, flip in (('forward', False), ('input grad', True)):
                found.append(spec(name, '_dwconv_tokens', f'{what} K={ks} {label}', conv_args,
                                  dict(KS=ks, FLIP=flip, HAS_BIAS=not flip, ACC=tl.float32, BLOCK_T=BLOCK_T,
                                       BLOCK_C=BLOCK_C), NUM_WARPS, aligned=('C', 'stride_wb')))
            found.append(spec(name, '_dwconv_taps_grad', f'taps grad K={ks} {label}',
                              dict(x_ptr=tokens, g_ptr=tokens, gw_ptr='*fp32', H='i32', W='i32', C='i32',
                                   CHUNK='i32', KS='constexpr', TAPS='constexpr', ACC='constexpr',
                                   BLOCK_C='constexpr'),
                              dict(KS=ks, TAPS=triton.next_power_of_2(ks * ks), ACC=tl.float32, BLOCK_C=BLOCK_C),
                              NUM_WARPS,
                              aligned=('C', 'CHUNK')))
    return found
