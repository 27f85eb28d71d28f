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

import torch

from mmwf.utils.tf32_settings import matmul_tf32

from .dwconv_triton import check_device
from .triton_utils import INTERPRETED, TRITON_AVAILABLE, accumulator, launch_device, pointer_type

if TRITON_AVAILABLE:
    import triton
    import triton.language as tl

__all__ = ['low_rank_linear_triton']


# the autotuned tiles (tokens x output channels x reduction step, warps, stages); under Triton's interpreter the first
# only, which keeps the CPU tests from running every tile (the autotuner times each on a GPU)
TILES = [(64, 64, 32, 4, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 128, 32, 8, 3)]
# token blocks of a group: the programs that run together share a band of GROUP_T token blocks, so that a block of x
# is read from memory once for all its output blocks and each W0 column block serves the whole band from L2
GROUP_T = 8


def _configs() -> list:
    tiles = TILES[:1] if INTERPRETED else TILES
    return [triton.Config(dict(BLOCK_T=t, BLOCK_CO=co, BLOCK_CI=ci, GROUP_T=GROUP_T), num_warps=w, num_stages=s)
            for t, co, ci, w, s in tiles]


def _prune(configs: list, args: dict, **kwargs) -> list:
    """The tiles for the operands. Without tensor cores (IEEE fp32, fp64: the products on the FMA units, a thread
    holding its share of the tile and of both operands in registers) 128-token tiles spill on sm_80, so fp32 keeps
    the 64-token ones and fp64 (the tests' equations) the first; TF32, bf16 and fp16 take every tile."""
    itemsize = args['x_ptr'].dtype.itemsize
    if kwargs.get('PRECISION') == 'ieee' and itemsize >= 4:
        return [c for c in configs if c.kwargs['BLOCK_T'] == 64 and (itemsize == 4 or c is configs[0])]
    return configs


if TRITON_AVAILABLE:
    @triton.autotune(configs=_configs(), key=['N', 'CIN', 'RANK', 'COUT', 'PRECISION'],
                     prune_configs_by=dict(early_config_prune=_prune))
    @triton.jit
    def _low_rank_linear(x_ptr, t_ptr, w_ptr, r_ptr, b_ptr, y_ptr, N, CIN, RANK, COUT, stride_rb,
                         HAS_BIAS: tl.constexpr, GELU: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
                         UPCAST: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_CI: tl.constexpr,
                         GROUP_T: tl.constexpr):
        """One (token block, output block) tile of a sample's y = act(x W0 + t R + bias); x (B, N, CIN), t (B, N,
        RANK) and y (B, N, COUT) contiguous, W0 (CIN, COUT), R (B, RANK, COUT) with batch stride ``stride_rb``; sums
        in ACC (UPCAST: the operands converted to ACC before each product, exactly). Axis 0 numbers a sample's tiles
        in groups of GROUP_T token blocks, output blocks within a group before the next token blocks (Triton's
        matmul tutorial's order): consecutive programs reuse x's and W0's blocks from L2, where token blocks first
        read all of x again for each output block."""
        pid = tl.program_id(0)  # axis 0: the only one without CUDA's 65535 limit
        b = tl.program_id(1).to(tl.int64)
        blocks_t, blocks_co = tl.cdiv(N, BLOCK_T), tl.cdiv(COUT, BLOCK_CO)
        group = pid // (GROUP_T * blocks_co)
        first_t = group * GROUP_T
        rows = tl.minimum(blocks_t - first_t, GROUP_T)  # the last group may have fewer token blocks
        block_t = first_t + (pid % (GROUP_T * blocks_co)) % rows
        block_co = (pid % (GROUP_T * blocks_co)) // rows
        n = block_t * BLOCK_T + tl.arange(0, BLOCK_T)
        co = block_co * BLOCK_CO + tl.arange(0, BLOCK_CO)
        steps = tl.arange(0, BLOCK_CI)
        in_n, in_co = n < N, co < COUT
        acc = tl.zeros([BLOCK_T, BLOCK_CO], dtype=ACC)
        for start in range(0, CIN, BLOCK_CI):  # the base GEMM's rows: x W0
            ci = start + steps
            a = tl.load(x_ptr + b * N * CIN + n[:, None] * CIN + ci[None, :],
                        mask=in_n[:, None] & (ci < CIN)[None, :], other=0.0)
            w = tl.load(w_ptr + ci[:, None] * COUT + co[None, :], mask=(ci < CIN)[:, None] & in_co[None, :],
                        other=0.0)
            if UPCAST:
                a, w = a.to(ACC), w.to(ACC)
            acc = tl.dot(a, w, acc, input_precision=PRECISION, out_dtype=ACC)
        for start in range(0, RANK, BLOCK_CI):  # the low-rank rows: t R[b]
            r = start + steps
            a = tl.load(t_ptr + b * N * RANK + n[:, None] * RANK + r[None, :],
                        mask=in_n[:, None] & (r < RANK)[None, :], other=0.0)
            w = tl.load(r_ptr + b * stride_rb + r[:, None] * COUT + co[None, :],
                        mask=(r < RANK)[:, None] & in_co[None, :], other=0.0)
            if UPCAST:
                a, w = a.to(ACC), w.to(ACC)
            acc = tl.dot(a, w, acc, input_precision=PRECISION, out_dtype=ACC)
        if HAS_BIAS:
            acc += tl.load(b_ptr + co, mask=in_co, other=0.0).to(ACC)[None, :]
        if GELU:  # exact (erf) GELU, nn.GELU()'s
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        tl.store(y_ptr + b * N * COUT + n[:, None] * COUT + co[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=in_n[:, None] & in_co[None, :])


# Triton's interpreter multiplies 16-bit float tiles in tl.dot as their bit patterns; there the kernel converts them
# to fp32 first, which is exact, and the products and sums are then the GPU's (exact products, fp32 sums): UPCAST


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's precision for fp32 operands: TF32 where torch's CUDA matmuls may use it
    (:func:`~mmwf.utils.tf32_settings.matmul_tf32`, whichever API set it), else IEEE (bf16 / fp16 / fp64 operands
    multiply exactly into their fp32 / fp64 sums either way)."""
    return 'tf32' if dtype == torch.float32 and matmul_tf32() else 'ieee'


def _check_linear(x: torch.Tensor, t: torch.Tensor, weight: torch.Tensor, right: torch.Tensor,
                  bias: torch.Tensor | None) -> None:
    B, N, cin = x.shape
    rank, cout = right.shape[-2:]
    if (t.shape != (B, N, rank) or weight.shape != (cin, cout) or right.dim() != 3 or right.shape[0] not in (1, B)
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
    _check_linear(x, t, weight, right, bias)
    B, N, cin = x.shape
    rank, cout = right.shape[-2:]
    x, t, weight, right = x.contiguous(), t.contiguous(), weight.contiguous(), right.contiguous()
    y = x.new_empty(B, N, cout)
    if y.numel() == 0:
        return y
    def grid(meta):  # a sample's tiles on axis 0, in the kernel's grouped order; the samples on axis 1
        return triton.cdiv(N, meta['BLOCK_T']) * triton.cdiv(cout, meta['BLOCK_CO']), B

    with launch_device(x.device):
        _low_rank_linear[grid](x, t, weight, right, right if bias is None else bias, y, N, cin, rank, cout,
                               0 if right.shape[0] == 1 else right.stride(0), HAS_BIAS=bias is not None, GELU=gelu,
                               ACC=accumulator(x.dtype), PRECISION=_precision(x.dtype),
                               UPCAST=INTERPRETED and x.dtype.itemsize < 4)
    return y


@torch.library.custom_op('mmwf::low_rank_linear', mutates_args=())
def _low_rank_linear_op(x: torch.Tensor, t: torch.Tensor, weight: torch.Tensor, right: torch.Tensor,
                        bias: torch.Tensor | None, gelu: bool = False) -> torch.Tensor:
    return _forward(x, t, weight, right, bias, gelu)


@_low_rank_linear_op.register_fake
def _(x, t, weight, right, bias, gelu=False):
    return x.new_empty(*x.shape[:2], weight.shape[1])


def _setup_linear(ctx, inputs, output) -> None:
    x, t, weight, right, bias, gelu = inputs
    ctx.save_for_backward(x, t, weight, right, bias)
    ctx.gelu = gelu


def _linear_backward(ctx, grad):
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


_low_rank_linear_op.register_autograd(_linear_backward, setup_context=_setup_linear)


def low_rank_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, left: torch.Tensor,
                           right: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """act(x weight + (x left) right + bias) for tokens x (B, N, Cin), weight (Cin, Cout), left (B or 1, Cin, K)
    or (Cin, K), right (B or 1, K, Cout), bias (Cout) or None; act is the exact GELU when ``gelu``, else none:
    (B, N, Cout), by the Triton kernel (on the CPU under ``TRITON_INTERPRET=1``). Under autocast the operands are
    cast to its dtype, as F.linear's are (fp64 tokens are left as they are)."""
    if not TRITON_AVAILABLE:
        raise RuntimeError('low_rank_linear_triton needs triton (it ships with torch\'s CUDA builds)')
    check_device(x, "form='fused' (low_rank_linear_triton)", "form='auto' (or 'factored', 'materialized')")
    device_type = x.device.type
    autocast = torch.is_autocast_enabled(device_type) and x.dtype != torch.float64  # autocast leaves fp64 alone
    dtype = torch.get_autocast_dtype(device_type) if autocast else x.dtype
    x, weight, left, right = (v.to(dtype) for v in (x, weight, left, right))
    bias = None if bias is None else bias.to(dtype)
    if left.dim() not in (2, 3) or left.shape[-2] != x.shape[-1]:
        raise ValueError(f'low_rank_linear_triton: left {tuple(left.shape)} is not (B or 1, {x.shape[-1]}, K) '
                         f'nor ({x.shape[-1]}, K)')
    t = torch.matmul(x, left)
    _check_linear(x, t, weight, right, bias)
    return _low_rank_linear_op(x, t, weight, right, bias, gelu)


def aot_specializations() -> list:
    """The kernel's specializations the layers reach, for :mod:`.triton_targets`: operands in fp32 (IEEE or TF32,
    as torch's matmuls are set), bf16 or fp16, each at the autotuned tiles its dtype keeps (:func:`_prune`), with
    the bias and the GELU epilogue."""
    from types import SimpleNamespace

    from .triton_targets import spec
    found = []
    for label, dtype, precision in (('fp32', torch.float32, 'ieee'), ('tf32', torch.float32, 'tf32'),
                                    ('bf16', torch.bfloat16, 'ieee'), ('fp16', torch.float16, 'ieee')):
        operand = pointer_type(dtype)
        args = dict(x_ptr=operand, t_ptr=operand, w_ptr=operand, r_ptr=operand, b_ptr=operand, y_ptr=operand,
                    N='i32', CIN='i32', RANK='i32', COUT='i32', stride_rb='i32', HAS_BIAS='constexpr',
                    GELU='constexpr', ACC='constexpr', PRECISION='constexpr', UPCAST='constexpr',
                    BLOCK_T='constexpr', BLOCK_CO='constexpr', BLOCK_CI='constexpr', GROUP_T='constexpr')
        for config in _prune(_configs(), dict(x_ptr=SimpleNamespace(dtype=dtype)), PRECISION=precision):
            tile = config.kwargs
            found.append(spec(__name__, '_low_rank_linear',
                              f'{label} {tile["BLOCK_T"]}x{tile["BLOCK_CO"]}x{tile["BLOCK_CI"]}', args,
                              dict(HAS_BIAS=True, GELU=True, ACC=tl.float32, PRECISION=precision, UPCAST=False,
                                   **tile), config.num_warps, config.num_stages,
                              aligned=('N', 'CIN', 'RANK', 'COUT', 'stride_rb')))
    return found
