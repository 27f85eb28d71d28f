"""The evaluations of a dynamic block's operations timed against each other on one device, beside the one the kernel
table and the cost rule pick (``tools/analysis/benchmark.py kernels``): the per-sample depthwise conv
(:func:`~mmwf.models.layers.dynamic_dwconv.per_sample_depthwise_conv`'s four, and its Triton kernel on CUDA), the
adaptive pooling of its predictor (PyTorch's op, two averaging matrices or one product over the tokens) and the
Bilateral dynamic linear's update (factored or materialized, each in the tokens' or the core's order:
:func:`~mmwf.models.layers.dynamic_linear.weight_form`, whose per-element charge is the device's; and on CUDA the
factored form's Triton kernel). Each evaluation is called directly, so nothing global is changed to force one.
Beside the times, each operation's memory time: the bytes it must move (:func:`io_bytes`) over the copy bandwidth
measured on the device (:func:`copy_bandwidth`)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmwf.models.layers.dynamic_dwconv import (
    adaptive_pool_kernel,
    per_sample_depthwise_conv,
    pool_tokens_adaptive,
    pooling_matrices,
)
from mmwf.models.layers.dynamic_linear import weight_form
from mmwf.models.layers.implementation import kernel
from mmwf.models.layers.tokens import tokens_to_map

from .timing import time_call

MODES = ('inference', 'training')


def first_dynamic_block(arch: str) -> nn.Module:
    """The first dynamic block of WeightFormer ``arch`` (``'t'``, ``'s'``, ...): its ``dwc`` (Adaptive) and
    ``linear1`` (Bilateral) are the layers timed."""
    from mmwf.models.backbones import WeightFormer
    model = WeightFormer(arch)
    return next(b for b in model.blocks if not isinstance(b.norm1, nn.Identity))


class Case:
    """One operation at one shape and mode: its evaluations by name (each a call that runs it, with its backward in
    training), the name the rule picks there and the bytes any evaluation must move (:func:`io_bytes`).

    Args:
        operation (str): what is computed.
        evaluations (dict[str, Callable]): name -> a call computing it that way.
        rule (str): the evaluation the kernel table / cost rule takes for this shape, device and mode.
        bytes (int): the operation's inputs and outputs, each moved once (:func:`io_bytes`).
        entry (str): the operation's name in the kernel table (``KERNELS``): what a proposal from these timings sets.
    """

    def __init__(self, operation: str, evaluations: dict[str, Callable[[], object]], rule: str, bytes: int,
                 entry: str) -> None:
        self.operation, self.evaluations, self.rule, self.bytes = operation, evaluations, rule, bytes
        self.entry = entry


def proposed_entries(wins: dict[tuple[str, str], list[str]], device_type: str) -> dict[str, tuple[str, int, int]]:
    """The kernel table's entries timings propose for ``device_type``: for each (table entry, mode), the evaluation
    fastest in the most cases (the first on a tie), keyed as the table keys it (``depthwise_conv_cuda``; training:
    ``..._autograd``), with the cases it won and the cases timed. A dynamic weight's evaluation is its form (the
    order stays the cost rule's). ``wins``: (entry, mode) -> the fastest evaluation of each case."""
    proposal = {}
    for (entry, mode), fastest in wins.items():
        names = [name.split(' / ')[0] if entry == 'dynamic_weight' else name for name in fastest]
        best = max(dict.fromkeys(names), key=names.count)
        key = f'{entry}_{device_type}' + ('_autograd' if mode == 'training' else '')
        proposal[key] = (best, names.count(best), len(names))
    return proposal


def io_bytes(inputs: list[torch.Tensor], outputs: list[torch.Tensor], training: bool) -> int:
    """The bytes an operation moves at the least: in inference its inputs read and its outputs written once; in
    training also the backward's, the outputs' gradients and the inputs read again and the inputs' gradients written
    (each input differentiated: 3 x inputs + 2 x outputs). Over a device's bandwidth, its memory time."""
    size = sum(t.numel() * t.element_size() for t in inputs), sum(t.numel() * t.element_size() for t in outputs)
    return 3 * size[0] + 2 * size[1] if training else size[0] + size[1]


def copy_bandwidth(device: str, megabytes: int = 256, rounds: int = 5) -> float:
    """Bytes per second a copy of a ``megabytes`` buffer moves on ``device`` (read and write; the median of
    ``rounds``): the bandwidth the memory times are taken against, measured where they are."""
    src = torch.empty(megabytes * 2 ** 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = sorted(time_call(lambda: dst.copy_(src), device) for _ in range(rounds))[rounds // 2]
    return 2 * src.numel() / seconds


def timed(fn: Callable[[], torch.Tensor], leaves: list[torch.Tensor], training: bool) -> Callable[[], object]:
    """``fn`` under no_grad (inference), or with the backward of its sum to ``leaves`` (training)."""
    if not training:
        def call() -> object:
            with torch.no_grad():
                return fn()
        return call

    def call() -> object:
        return torch.autograd.grad(fn().float().sum(), leaves)
    return call


def kernel_cases(arch: str, size: int, batch: int, device: str, mode: str) -> list[Case]:
    """The cases of WeightFormer ``arch``'s first dynamic block at ``size`` x ``size`` images (patch 16), batch
    ``batch``, in ``mode`` (``'inference'`` or ``'training'``: forward and backward)."""
    if mode not in MODES:
        raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
    training = mode == 'training'
    block = first_dynamic_block(arch).to(device).train(training)
    dwc, linear = block.dwc, block.linear1
    hw = (size // 16, size // 16)
    tokens = torch.randn(batch, hw[0] * hw[1], dwc.dim, device=device, requires_grad=training)
    x = tokens_to_map(tokens, hw)  # the channels-last view the layer convolves
    with torch.no_grad():
        weight = dwc.w.squeeze(1) + dwc.effective_delta(tokens, hw)
    weight.requires_grad_(training)
    leaves = [tokens, weight] if training else []
    device_type = torch.device(device)
    impls = ('loop', 'grouped', 'taps', 'shift', *(('triton',) if device_type.type == 'cuda' else ()))
    conv = {impl: timed(lambda impl=impl: per_sample_depthwise_conv(x, weight, dwc.b, impl), leaves, training)
            for impl in impls}
    taps = weight.flatten(1)
    cases = [Case(f'per-sample depthwise conv {dwc.kernel_size}x{dwc.kernel_size}, C={dwc.dim}', conv,
                  kernel('depthwise_conv', device_type, training), io_bytes([tokens, taps], [tokens], training),
                  'depthwise_conv')]
    k = dwc.kernel_size
    pool = {'native': timed(lambda: F.adaptive_avg_pool2d(x, k), [tokens] if training else [], training),
            'matrices': timed(lambda: pooling_matrices(x, k), [tokens] if training else [], training),
            'tokens': timed(lambda: pool_tokens_adaptive(tokens, hw, k), [tokens] if training else [], training)}
    with torch.set_grad_enabled(training):
        pool_rule = adaptive_pool_kernel(x)
    cases.append(Case(f'adaptive pooling to {k}x{k}', pool, pool_rule,
                      io_bytes([tokens], [taps], training), 'adaptive_pool'))
    a, b = linear.predict(tokens, hw)
    a, b = a.detach().requires_grad_(training), b.detach().requires_grad_(training)
    leaves = [tokens, a, b] if training else []
    update = {}
    forms = ('factored', 'materialized', *(('fused',) if device_type.type == 'cuda' else ()))
    for form in forms:
        for order in ('tokens', 'core'):
            if form != 'materialized':
                def fn(order=order, fused=form == 'fused') -> torch.Tensor:
                    return linear.apply_factors(tokens, *linear.factors(a, b, order), fused=fused)
            else:
                def fn(order=order) -> torch.Tensor:
                    return linear.apply_update(tokens, linear.product(a, b, order))
            update[f'{form} / {order}'] = timed(fn, leaves, training)
    costs = linear.costs(a.shape[1], tokens.shape[1])
    form, order = weight_form(costs, linear.order, linear.in_features * linear.out_features, training, linear.form,
                              device_type.type)
    out = tokens.new_empty(*tokens.shape[:2], linear.out_features)
    cases.append(Case(f'Bilateral update, {linear.in_features}->{linear.out_features}', update, f'{form} / {order}',
                      io_bytes([tokens, a, b, linear.w], [out], training), 'dynamic_weight'))
    return cases
