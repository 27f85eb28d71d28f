"""Running a stack of blocks, with activation checkpointing while training (the backbones' and the denoisers'
``with_cp``)."""
from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, *args, with_cp: bool = False
               ) -> Iterator[tuple[int, torch.Tensor]]:
    """Apply ``blocks`` in turn as ``x = block(x, *args)`` (tokens x (B, N, C); e.g. the grid ``hw``, or the
    conditioning and the grid), yielding (index, output) after each. With ``with_cp``, a block that trains and needs
    gradients keeps only its inputs and recomputes its activations in the backward pass (non-reentrant
    ``torch.utils.checkpoint``, the RNG state preserved): the same gradients for less memory."""
    for i, block in enumerate(blocks):
        if with_cp and block.training and torch.is_grad_enabled():
            x = cp.checkpoint(block, x, *args, use_reentrant=False)
        else:
            x = block(x, *args)
        yield i, x
