"""FLOP counting with mmengine's analyzer, plus the ops it does not know (multiply-accumulates, the
fvcore / mmengine convention: a matmul of m x k by k x n counts m*k*n)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from math import prod

import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import get_shape


def sdpa_flop_jit(inputs: list, outputs: list) -> int:
    """``aten::scaled_dot_product_attention``: Q K^T and A V, each B*h*N*M*d (softmax not counted)."""
    q, k, v = (get_shape(t) for t in inputs[:3])
    return prod(q[:-1]) * k[-2] * q[-1] + prod(q[:-1]) * k[-2] * v[-1]


EXTRA_HANDLES: dict[str, Callable] = {
    'aten::scaled_dot_product_attention': sdpa_flop_jit,
}


def flop_analyzer(model: nn.Module, inputs: torch.Tensor | tuple) -> FlopAnalyzer:
    """mmengine's FlopAnalyzer that also counts fused attention, with its warnings silenced."""
    analyzer = FlopAnalyzer(model, inputs).set_op_handle(**EXTRA_HANDLES)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    return analyzer


def count_flops(model: nn.Module, inputs: torch.Tensor | tuple) -> int:
    """Total multiply-accumulates of ``model(*inputs)``."""
    return int(flop_analyzer(model, inputs).total())


@contextmanager
def released_order(model: nn.Module) -> Iterator[nn.Module]:
    """Evaluate every dynamic linear with a choice of order (Bilateral, eq. 8, and the correlation strategies,
    eqs. 5-7) in the token order (same outputs): the release's for Bilateral, the one whose FLOPs the paper's
    Table 2 reports for eqs. 5-7; e.g. to count FLOPs under the paper's convention. Restores the previous
    setting on exit."""
    from mmwf.models.layers import DynamicLinear
    layers = [m for m in model.modules() if isinstance(m, DynamicLinear) and hasattr(m, 'order')]
    saved = [m.order for m in layers]
    for m in layers:
        m.order = 'tokens'
    try:
        yield model
    finally:
        for m, order in zip(layers, saved):
            m.order = order
