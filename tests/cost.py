"""Helpers for cost tests: every tensor shape an autograd run creates, and bytes saved for backward."""
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class TensorShapes(TorchDispatchMode):
    """Records the shape of every tensor an op returns while active."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def saved_bytes(forward: Callable[[], torch.Tensor]) -> int:
    """Bytes autograd saves for backward while ``forward()`` runs."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return total
