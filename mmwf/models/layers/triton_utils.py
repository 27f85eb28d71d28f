"""What mmwf's Triton kernels (``dwconv_triton``, ``dynamic_linear_triton``) share: whether triton is there, whether
it interprets, the kernels' accumulator type, the launch's device, and the argument types their ahead-of-time
compilation (:mod:`.triton_targets`) names.

The kernels name one thing one way: ``BLOCK_T`` tokens, ``BLOCK_C`` channels of a depthwise kernel, ``BLOCK_CI`` /
``BLOCK_CO`` input / output channels of a linear, ``KS`` a kernel size, ``RANK`` a factorisation's rank.
"""
from __future__ import annotations

import contextlib
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - torch's CUDA builds ship triton
    triton = tl = None

__all__ = ['TRITON_AVAILABLE', 'INTERPRETED', 'accumulator', 'launch_device', 'pointer_type']
TRITON_AVAILABLE = triton is not None
# Triton's interpreter (the CPU): read when a kernel is defined, as triton.jit reads it
INTERPRETED = os.environ.get('TRITON_INTERPRET') == '1'
POINTER_TYPES = {torch.float64: '*fp64', torch.float32: '*fp32', torch.bfloat16: '*bf16', torch.float16: '*fp16'}


def accumulator(dtype: torch.dtype):
    """The kernels' sums: fp64 for fp64 tensors (the equations' tests), else fp32 (bf16 / fp16 inputs too)."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def launch_device(device: torch.device):
    """Triton launches on the current CUDA device: a context that makes it the tensors' for the launch."""
    return torch.cuda.device(device) if device.type == 'cuda' else contextlib.nullcontext()


def pointer_type(dtype: torch.dtype) -> str:
    """A tensor argument's type in a kernel's signature (``'*bf16'``), for an ahead-of-time compilation."""
    return POINTER_TYPES[dtype]
