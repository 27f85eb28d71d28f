"""Where the tests run mmwf's Triton kernels: on the GPU where there is one (the compiled kernels, which cannot read
CPU tensors), else on the CPU under Triton's interpreter (tests/conftest.py turns it on there). Every test of a
Triton kernel builds its tensors on :data:`TRITON_DEVICE`; the references in fp64 run there or on the CPU."""
from __future__ import annotations

import contextlib

import torch

TRITON_DEVICE = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
INTERPRETED = TRITON_DEVICE.type == 'cpu'
# One fp32 addition of a kernel's sums errs by at most this many halves of an fp32 ulp (of the sum's magnitude):
# one where each is rounded to nearest (the interpreter's numpy, the GPU's FMA), two on the GPU's tensor cores,
# whose fp32 accumulation truncates (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021).
TENSOR_CORE_ROUNDINGS = 1 if INTERPRETED else 2


@contextlib.contextmanager
def full_fp32():
    """torch's fp32 matrix products and convolutions in IEEE fp32 on CUDA for a comparison with fp32 tolerances
    (cuDNN takes TF32 by default from Ampere on: 10 mantissa bits), the flags restored after; nothing on the CPU."""
    if TRITON_DEVICE.type != 'cuda':
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextlib.contextmanager
def fp32_sums_in_cublas():
    """cuBLAS's bf16 / fp16 GEMMs with fp32 sums throughout (torch lets them reduce in the low precision by default:
    split-K partial sums in bf16), the flags restored after; nothing on the CPU."""
    if TRITON_DEVICE.type != 'cuda':
        yield
        return
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = saved
