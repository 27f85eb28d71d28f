"""The factored dynamic linear as one Triton kernel, a PyTorch custom operator (``mmwf::low_rank_linear``) with its
backward in GEMMs, so that eager code and ``torch.compile`` form neither a weight per sample nor the update's
(B, N, Cout) term apart from the output:

    y[b] = act(x[b] W0 + t[b] R[b] + bias),   t[b] = x[b] L[b]   (act: identity or exact GELU)

x (B, N, Cin), W0 (Cin, Cout), L (B or 1, Cin, K), R (B or 1, K, Cout), y (B, N, Cout). The thin product t = x L
(K < Cin) is one batched GEMM; the kernel then runs one reduction over the Cin + K rows of [x | t] and [W0 ; R[b]]
(the base GEMM and the per-sample low-rank term of multi-LoRA serving) with the bias and the activation in its
epilogue. The reference evaluations stay in :class:`~.dynamic_linear.DynamicLinear` (``apply_factors``,
``apply_update``), which tests compare this kernel with.
"""
from __future__ import annotations

import os

import torch

from .dwconv_triton import TRITON_AVAILABLE, _accumulator, _on

if TRITON_AVAILABLE:
    import triton
    import triton.language as tl

__all__ = ['low_rank_linear_triton']


if TRITON_AVAILABLE:
    @triton.jit
    def _low_rank_linear(x_ptr, t_ptr, w_ptr, r_ptr, b_ptr, y_ptr, N, CIN, K, COUT, stride_rb,
                         HAS_BIAS: tl.constexpr, GELU: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
                         UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """One (token block, sample, output block) of y = act(x W0 + t R + bias); x (B, N, CIN), t (B, N, K) and y
        (B, N, COUT) contiguous, W0 (CIN, COUT), R (B, K, COUT) with batch stride ``stride_rb``; sums in ACC
        (UPCAST: the operands converted to ACC before each product, exactly)."""
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # axis 0: the only one without CUDA's 65535 limit
        b = tl.program_id(1).to(tl.int64)
        n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = tl.arange(0, BLOCK_K)
        in_m, in_n = m < N, n < COUT
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
        for start in range(0, CIN, BLOCK_K):  # the base GEMM's rows: x W0
            k = start + rows
            a = tl.load(x_ptr + b * N * CIN + m[:, None] * CIN + k[None, :], mask=in_m[:, None] & (k < CIN)[None, :],
                        other=0.0)
            w = tl.load(w_ptr + k[:, None] * COUT + n[None, :], mask=(k < CIN)[:, None] & in_n[None, :], other=0.0)
            if UPCAST:
                a, w = a.to(ACC), w.to(ACC)
            acc = tl.dot(a, w, acc, input_precision=PRECISION, out_dtype=ACC)
        for start in range(0, K, BLOCK_K):  # the low-rank rows: t R[b]
            k = start + rows
            a = tl.load(t_ptr + b * N * K + m[:, None] * K + k[None, :], mask=in_m[:, None] & (k < K)[None, :],
                        other=0.0)
            w = tl.load(r_ptr + b * stride_rb + k[:, None] * COUT + n[None, :], mask=(k < K)[:, None] & in_n[None, :],
                        other=0.0)
            if UPCAST:
                a, w = a.to(ACC), w.to(ACC)
            acc = tl.dot(a, w, acc, input_precision=PRECISION, out_dtype=ACC)
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=in_n, other=0.0).to(ACC)[None, :]
        if GELU:  # exact (erf) GELU, nn.GELU()'s
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        tl.store(y_ptr + b * N * COUT + m[:, None] * COUT + n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=in_m[:, None] & in_n[None, :])


BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 32
# Triton's interpreter multiplies 16-bit float tiles in tl.dot as their bit patterns; there the kernel converts them
# to fp32 first, which is exact, and the products and sums are then the GPU's (exact products, fp32 sums)
INTERPRETED = os.environ.get('TRITON_INTERPRET') == '1'


def _matmul_tf32() -> bool:
    """Whether torch's CUDA matmuls may use TF32: the newer per-backend setting where one is made (reading the
    legacy flag then raises), else the legacy ``allow_tf32``."""
    for setting in (torch.backends.cuda.matmul.fp32_precision, torch.backends.fp32_precision):
        if setting in ('tf32', 'ieee'):
            return setting == 'tf32'
    return torch.backends.cuda.matmul.allow_tf32


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's precision for fp32 operands: TF32 where torch's matmuls may use it, else IEEE (bf16 / fp16 / fp64
    operands multiply exactly into their fp32 / fp64 sums either way)."""
    return 'tf32' if dtype == torch.float32 and _matmul_tf32() else 'ieee'


def _check(x: torch.Tensor, t: torch.Tensor, weight: torch.Tensor, right: torch.Tensor,
           bias: torch.Tensor | None) -> None:
    B, N, cin = x.shape
    k, cout = right.shape[-2:]
    if (t.shape != (B, N, k) or weight.shape != (cin, cout) or right.dim() != 3 or right.shape[0] not in (1, B)
            or (bias is not None and bias.shape != (cout,))):
        raise ValueError(f'low_rank_linear_triton: tokens {tuple(x.shape)}, x left {tuple(t.shape)}, weight '
                         f'{tuple(weight.shape)}, right {tuple(right.shape)} and bias '
                         f'{None if bias is None else tuple(bias.shape)} do not fit: they are (B, N, Cin), (B, N, K), '
                         '(Cin, Cout), (B or 1, K, Cout) and (Cout)')
    dtypes = {x.dtype, t.dtype, weight.dtype, right.dtype, *(() if bias is None else (bias.dtype,))}
    if len(dtypes) > 1:
        raise ValueError(f'low_rank_linear_triton: the operands have dtypes {sorted(map(str, dtypes))}; give one')


def _forward(x: torch.Tensor, t: torch.Tensor, weight: torch.Tensor, right: torch.Tensor, bias: torch.Tensor | None,
             gelu: bool) -> torch.Tensor:
    _check(x, t, weight, right, bias)
    B, N, cin = x.shape
    k, cout = right.shape[-2:]
    x, t, weight, right = x.contiguous(), t.contiguous(), weight.contiguous(), right.contiguous()
    y = x.new_empty(B, N, cout)
    if y.numel() == 0:
        return y
    grid = (triton.cdiv(N, BLOCK_M), B, triton.cdiv(cout, BLOCK_N))
    with _on(x.device):
        _low_rank_linear[grid](x, t, weight, right, right if bias is None else bias, y, N, cin, k, cout,
                               0 if right.shape[0] == 1 else right.stride(0), HAS_BIAS=bias is not None, GELU=gelu,
                               ACC=_accumulator(x.dtype), PRECISION=_precision(x.dtype),
                               UPCAST=INTERPRETED and x.dtype.itemsize < 4, BLOCK_M=BLOCK_M,
                               BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return y


@torch.library.custom_op('mmwf::low_rank_linear', mutates_args=())
def _low_rank_linear_op(x: torch.Tensor, t: torch.Tensor, weight: torch.Tensor, right: torch.Tensor,
                        bias: torch.Tensor | None, gelu: bool = False) -> torch.Tensor:
    return _forward(x, t, weight, right, bias, gelu)


@_low_rank_linear_op.register_fake
def _(x, t, weight, right, bias, gelu=False):
    return x.new_empty(*x.shape[:2], weight.shape[1])


def _setup_context(ctx, inputs, output) -> None:
    x, t, weight, right, bias, gelu = inputs
    ctx.save_for_backward(x, t, weight, right, bias)
    ctx.gelu = gelu


def _backward(ctx, grad):
    """The gradients as GEMMs: with the pre-activation z formed again for GELU's derivative (one more pass of the
    kernel, not a kept (B, N, Cout) tensor), dz W0^T, dz R^T, x^T dz over all tokens, t^T dz per sample."""
    x, t, weight, right, bias = ctx.saved_tensors
    if ctx.gelu:
        grad = torch.ops.aten.gelu_backward(grad, _low_rank_linear_op(x, t, weight, right, bias, False))
    grad_x = grad @ weight.t() if ctx.needs_input_grad[0] else None
    grad_t = torch.matmul(grad, right.transpose(1, 2)) if ctx.needs_input_grad[1] else None
    grad_w = grad_r = grad_b = None
    if ctx.needs_input_grad[2]:
        grad_w = x.reshape(-1, x.shape[-1]).t() @ grad.reshape(-1, grad.shape[-1])
    if ctx.needs_input_grad[3]:
        grad_r = torch.matmul(t.transpose(1, 2), grad)
        grad_r = grad_r.sum(0, keepdim=True) if right.shape[0] == 1 else grad_r
    if bias is not None and ctx.needs_input_grad[4]:  # summed in fp32 at least, kept in the bias's dtype
        grad_b = grad.sum((0, 1), dtype=torch.promote_types(grad.dtype, torch.float32)).to(bias.dtype)
    return grad_x, grad_t, grad_w, grad_r, grad_b, None


_low_rank_linear_op.register_autograd(_backward, setup_context=_setup_context)


def low_rank_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, left: torch.Tensor,
                           right: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """act(x weight + (x left) right + bias) for tokens x (B, N, Cin), weight (Cin, Cout), left (B or 1, Cin, K)
    or (Cin, K), right (B or 1, K, Cout), bias (Cout) or None; act is the exact GELU when ``gelu``, else none:
    (B, N, Cout), by the Triton kernel (on the CPU under ``TRITON_INTERPRET=1``). Under autocast the operands are
    cast to its dtype, as F.linear's are (fp64 tokens are left as they are)."""
    if not TRITON_AVAILABLE:
        raise RuntimeError('low_rank_linear_triton needs triton (it ships with torch\'s CUDA builds)')
    device_type = x.device.type
    autocast = torch.is_autocast_enabled(device_type) and x.dtype != torch.float64  # autocast leaves fp64 alone
    dtype = torch.get_autocast_dtype(device_type) if autocast else x.dtype
    x, weight, left, right = (v.to(dtype) for v in (x, weight, left, right))
    bias = None if bias is None else bias.to(dtype)
    if left.dim() not in (2, 3) or left.shape[-2] != x.shape[-1]:
        raise ValueError(f'low_rank_linear_triton: left {tuple(left.shape)} is not (B or 1, {x.shape[-1]}, K) '
                         f'nor ({x.shape[-1]}, K)')
    t = torch.matmul(x, left)
    _check(x, t, weight, right, bias)
    return _low_rank_linear_op(x, t, weight, right, bias, gelu)
