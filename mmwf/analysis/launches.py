"""Kernel launches counted without a GPU: the aten operations a call dispatches, under a dispatch mode on the CPU,
with the layers' evaluations of the device counted for (:func:`~mmwf.models.layers.implementation.resolved_as`).
Eager GPU training of small models is launch-bound, so this count is the cost a regression shows first. Views and
allocations launch nothing and are not counted."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmwf.models.layers.implementation import resolved_as

aten = torch.ops.aten
# operations that return new tensors without a kernel on the device: metadata and allocation
NO_KERNEL = frozenset({aten._unsafe_view, aten.empty, aten.empty_strided, aten.empty_like, aten.lift_fresh,
                       aten.promote_types, aten._reshape_alias, aten.sym_size, aten.sym_stride, aten.sym_numel,
                       aten.sym_storage_offset})


def launches_kernel(func: torch._ops.OpOverload) -> bool:
    """Whether an aten operation launches a kernel: not a view (its result aliases an input and is not written)
    and not in :data:`NO_KERNEL`."""
    if func.overloadpacket in NO_KERNEL:
        return False
    return not any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


class LaunchCounter(TorchDispatchMode):
    """Counts the kernel-launching aten operations dispatched in the block, by name (``counts``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches_kernel(func):
            self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def count_launches(call: Callable[[], object], device_type: str = 'cuda') -> Counter[str]:
    """The kernel-launching aten operations of ``call()`` (with its backward if it runs one), by name, with the
    layers' ``'auto'`` choices resolved as on ``device_type``."""
    with resolved_as(device_type), LaunchCounter() as counter:
        call()
    return counter.counts


def block_launches(block: torch.nn.Module, tokens: torch.Tensor, hw: tuple[int, int], training: bool,
                   device_type: str = 'cuda') -> Counter[str]:
    """:func:`count_launches` of one block on tokens (B, H*W, C): a forward at inference (``training`` False, under
    ``torch.no_grad``), or a forward and the backward of its sum; counted on the second call (what a run repeats:
    the first builds what the layers keep, e.g. the pooling matrix of the grid)."""
    block.train(training)
    if not training:
        def call() -> object:
            with torch.no_grad():
                return block(tokens, hw)
    else:
        leaf = tokens.detach().requires_grad_()

        def call() -> object:
            block(leaf, hw).sum().backward()
    with resolved_as(device_type):
        call()
    block.zero_grad(set_to_none=True)  # a training step's gradients are written, not accumulated
    return count_launches(call, device_type)
