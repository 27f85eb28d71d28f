"""How a dynamic layer's operations are evaluated: the choices each layer holds, the one rule that resolves
``'auto'``, and the scope that sets choices for a block of code.

An operation with several evaluations (all computing the same function) is a choice held by each layer as an
attribute set at construction (:data:`CHOICES`: ``conv``, ``pool``, ``form``, ``order``, ``update``, ``outer``),
``'auto'`` by default. ``'auto'`` is resolved when the layer runs, by one rule: the :data:`KERNELS` entry of the
running :func:`implementation` (eager, traced, exported, compiled) for the device and whether autograd records, and
where the entry says so, the cost model beside the operation (``'cheaper'``: :func:`~.dynamic_linear.product_order`,
:func:`~.dynamic_linear.weight_form`). The table is read-only; :func:`evaluation` sets layers' choices for a
block of code (tracing, export, counting, tests) and restores them. The Triton kernels (:data:`OWN_KERNELS`) hold in
eager and compiled code; traced and exported graphs keep the reference evaluations (:func:`in_graph`).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import MappingProxyType

import torch
import torch.nn as nn

# implementation -> operation -> kernel; an entry '<operation>_<device type>' overrides '<operation>' on that device,
# and '<operation>_<device type>_autograd' that entry where autograd records the operation (training)
_KERNELS: dict[str, dict[str, str]] = {
    'eager': dict(depthwise_conv='grouped', depthwise_conv_cpu='loop', depthwise_conv_cpu_autograd='grouped',
                  adaptive_pool='native', adaptive_pool_cuda='tokens',
                  product_order='cheaper', dynamic_weight='cheaper', weight_update='addcdiv'),
    'traced': dict(depthwise_conv='grouped', adaptive_pool='native', product_order='cheaper',
                   dynamic_weight='materialized', weight_update='addcdiv'),
    'traced-onnx': dict(depthwise_conv='taps', adaptive_pool='matrices', product_order='cheaper',
                        dynamic_weight='materialized', weight_update='div-add'),
    'compiled': dict(depthwise_conv='shift', adaptive_pool='tokens', product_order='cheaper',
                     dynamic_weight='cheaper', weight_update='addcdiv'),
    'exported': dict(depthwise_conv='grouped-static', adaptive_pool='matrices', product_order='cheaper-static',
                     dynamic_weight='materialized', weight_update='addcdiv'),
}
KERNELS = MappingProxyType({k: MappingProxyType(v) for k, v in _KERNELS.items()})

# a layer's attribute -> (the KERNELS operation its 'auto' resolves by, or None for a cost rule alone, the values it
# takes besides 'auto')
CHOICES: dict[str, tuple[str | None, tuple[str, ...]]] = {
    'conv': ('depthwise_conv', ('loop', 'grouped', 'taps', 'shift', 'triton')),  # the per-sample depthwise conv
    'pool': ('adaptive_pool', ('native', 'matrices', 'tokens')),  # a DWConv predictor's adaptive average pooling
    'order': ('product_order', ('tokens', 'core')),  # a dynamic linear's products around X^T X
    'form': ('dynamic_weight', ('factored', 'materialized', 'fused')),  # how a low-rank update is applied
    'update': ('weight_update', ('addcdiv', 'div-add')),  # how a weight formed per sample adds its update
    'outer': (None, ('left', 'right')),  # Deep (eq. 7): (W1 inner) W4 or W1 (inner W4), cheaper by product_cost
}


# the evaluations that are kernels of mmwf's own (Triton): they run in eager and compiled code; a traced or exported
# graph, where they have no form (TorchScript, ONNX), takes its implementation's entry (the reference evaluation)
OWN_KERNELS = frozenset({'triton', 'fused'})


def in_graph(value: str) -> str:
    """A layer's choice ``value`` as the running :func:`implementation` can take it: ``'auto'`` for one of
    :data:`OWN_KERNELS` in traced and exported graphs, else ``value``."""
    return 'auto' if value in OWN_KERNELS and implementation() not in ('eager', 'compiled') else value


def check_choice(name: str, value: str) -> str:
    """``value`` if it is ``'auto'`` or an evaluation of choice ``name`` (:data:`CHOICES`), else a ValueError."""
    allowed = ('auto', *CHOICES[name][1])
    if value not in allowed:
        raise ValueError(f'{name}={value!r} is not one of {allowed}')
    return value


@contextmanager
def evaluation(model: nn.Module, **choices: str) -> Iterator[nn.Module]:
    """Set ``choices`` (:data:`CHOICES`: e.g. ``order='tokens'``, ``form='materialized'``) on every layer of
    ``model`` that holds them, for the block; each layer's own values are restored on exit."""
    for name, value in choices.items():
        if name not in CHOICES:
            raise ValueError(f'{name!r} is not a layer choice; choose from {sorted(CHOICES)}')
        check_choice(name, value)
    saved = [(m, name, getattr(m, name)) for m in model.modules() for name in choices if name in getattr(
        m, 'choices', ())]
    for m, name, _ in saved:
        setattr(m, name, choices[name])
    try:
        yield model
    finally:
        for m, name, value in saved:
            setattr(m, name, value)


def implementation() -> str:
    """How the running forward is executed, a key of :data:`KERNELS`:

    - ``'traced'``: TorchScript tracing (mmengine's FLOP counter);
    - ``'traced-onnx'``: TorchScript tracing by the TorchScript ONNX exporter (``torch.onnx.export(dynamo=False)``);
    - ``'exported'``: ``torch.export``, and the dynamo ONNX exporter built on it;
    - ``'compiled'``: ``torch.compile``;
    - ``'eager'``: none of these.
    """
    if torch.jit.is_tracing():
        return 'traced-onnx' if torch.onnx.is_in_onnx_export() else 'traced'
    if torch.compiler.is_exporting():  # before compiling: exporting sets both
        return 'exported'
    if torch.compiler.is_compiling():
        return 'compiled'
    return 'eager'


def records_autograd(*tensors: torch.Tensor) -> bool:
    """Whether autograd records an operation on ``tensors`` (its backward pass follows): grad mode is on and one of
    them requires grad."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def has_forward_hooks(module: nn.Module) -> bool:
    """Whether a forward hook could see an output of ``module`` or of its submodules: then the blocks evaluate every
    submodule as it is (no fused or in-place evaluation could change what a hook saw). torch has no public query;
    its module-level dicts are read."""
    return bool(nn.modules.module._global_forward_hooks) or any(m._forward_hooks for m in module.modules())


# the device type whose choices 'auto' resolves to, where a block of code asks for another device's (resolved_as)
_resolved_as: str | None = None


@contextmanager
def resolved_as(device_type: str) -> Iterator[None]:
    """In the block, ``'auto'`` resolves to the evaluations of ``device_type`` (e.g. ``'cuda'``) whatever device the
    tensors are on: what a CUDA forward launches, counted on the CPU (:mod:`mmwf.analysis.launches`)."""
    global _resolved_as
    saved, _resolved_as = _resolved_as, device_type
    try:
        yield
    finally:
        _resolved_as = saved


def choice_device_type(device: torch.device) -> str:
    """The device type whose evaluations a layer on ``device`` takes: its own, or that of :func:`resolved_as`."""
    return _resolved_as or device.type


def kernel(operation: str, device: torch.device | None = None, autograd: bool = False) -> str:
    """The kernel of ``operation`` (a column of :data:`KERNELS`) under the running :func:`implementation`, on
    ``device`` and with or without ``autograd`` when the choice depends on them.

    Args:
        operation (str): ``'depthwise_conv'`` (the per-sample depthwise conv: ``'loop'``, ``'grouped'``,
            ``'taps'``, ``'grouped-static'`` (grouped where the batch size is static, else the taps) or
            ``'shift'``), ``'adaptive_pool'`` (``'native'``, ``'matrices'`` or ``'tokens'``:
            :func:`~.dynamic_dwconv.adaptive_avg_pool`), ``'product_order'`` (the dynamic
            linears' ``order='auto'``: ``'cheaper'``, ``'cheaper-static'`` (cheaper where the sizes are static, else
            ``'core'``) or ``'core'``), ``'dynamic_weight'`` (how a dynamic linear with a low-rank update applies
            it: ``'factored'``, never forming a weight per sample, ``'materialized'``, the release's weight per
            sample (the FLOP counter counts it, the ONNX graphs keep it), or ``'cheaper'``, by
            :func:`~.dynamic_linear.weight_form`) or ``'weight_update'`` (how a weight formed per sample adds its
            update: one ``'addcdiv'``, or ``'div-add'`` for the TorchScript exporter, which has no addcdiv).
        device (torch.device, optional): the device the operation runs on. Defaults to None (the entry for any
            device).
        autograd (bool): whether autograd records the operation (its backward follows). Defaults to False.
    """
    kernels = KERNELS[implementation()]
    if device is None:
        return kernels[operation]
    device_type = choice_device_type(device)
    on_device = kernels.get(f'{operation}_{device_type}', kernels[operation])
    return kernels.get(f'{operation}_{device_type}_autograd', on_device) if autograd else on_device
