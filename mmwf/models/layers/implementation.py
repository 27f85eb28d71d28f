"""How a dynamic layer picks the kernel of each of its operations: the choices a layer holds, the table and cost
rules behind ``'auto'``, and :func:`choose_kernel`, the one function every layer asks (docs/kernel_choice.md).

A layer holds one choice per operation with several evaluations (all computing the same function), set at
construction (:data:`CHOICES`: ``conv``, ``pool``, ``order``, ``form``, ``update``, ``outer``), ``'auto'`` by
default. When the layer runs, it asks :func:`choose_kernel` with that choice, the device, whether autograd records
and the sizes or costs the rule reads. The answer comes from four parts, in this order:

1. the graph modes: a traced or exported graph has no form for mmwf's Triton kernels (:data:`OWN_KERNELS`), so
   those choices fall back to ``'auto'`` there;
2. the table: ``'auto'`` takes the :data:`KERNELS` entry of the running :func:`implementation`, by device type
   (or the one :func:`resolved_as` names) and autograd (:func:`kernel`);
3. the sizes: ``'...-static'`` entries take the first kernel where the sizes are Python ints, the second where a
   ``torch.export`` graph keeps them symbolic;
4. the cost rules: ``'cheaper'`` takes the evaluation with the fewer multiply-adds, a weight formed per sample
   charged its memory passes by device (:data:`ELEMENT_PASS_COST`).

The table is read-only; :func:`evaluation` sets layers' choices for a block of code (tracing, export, counting,
tests) and restores them; :func:`recorded_kernels` lists what the layers chose in a block of code.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType

import torch
import torch.nn as nn

# implementation -> operation -> kernel; an entry '<operation>_<device type>' overrides '<operation>' on that device,
# and '<operation>_<device type>_autograd' that entry where autograd records the operation (training)
_KERNELS: dict[str, dict[str, str]] = {
    'eager': dict(depthwise_conv='grouped', depthwise_conv_cpu='loop', depthwise_conv_cpu_autograd='grouped',
                  adaptive_pool='native', adaptive_pool_cuda='tokens',
                  product_order='cheaper', dynamic_weight='cheaper', weight_update='addcdiv', outer_product='cheaper'),
    'traced': dict(depthwise_conv='grouped', adaptive_pool='native', product_order='cheaper',
                   dynamic_weight='materialized', weight_update='addcdiv', outer_product='cheaper'),
    'traced-onnx': dict(depthwise_conv='taps', adaptive_pool='matrices', product_order='cheaper',
                        dynamic_weight='materialized', weight_update='div-add', outer_product='cheaper'),
    'compiled': dict(depthwise_conv='shift', adaptive_pool='tokens', product_order='cheaper',
                     dynamic_weight='cheaper', weight_update='addcdiv', outer_product='cheaper'),
    'exported': dict(depthwise_conv='grouped-static', adaptive_pool='matrices', product_order='cheaper-static',
                     dynamic_weight='materialized', weight_update='addcdiv', outer_product='cheaper'),
}
KERNELS = MappingProxyType({k: MappingProxyType(v) for k, v in _KERNELS.items()})

# a layer's attribute -> (the KERNELS operation its 'auto' resolves by, the values it takes besides 'auto')
CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {
    'conv': ('depthwise_conv', ('loop', 'grouped', 'taps', 'shift', 'triton')),  # the per-sample depthwise conv
    'pool': ('adaptive_pool', ('native', 'matrices', 'tokens')),  # a DWConv predictor's adaptive average pooling
    'order': ('product_order', ('tokens', 'core')),  # a dynamic linear's products around X^T X
    'form': ('dynamic_weight', ('factored', 'materialized', 'fused')),  # how a low-rank update is applied
    'update': ('weight_update', ('addcdiv', 'div-add')),  # how a weight formed per sample adds its update
    'outer': ('outer_product', ('left', 'right')),  # Deep (eq. 7): (W1 inner) W4 or W1 (inner W4)
}

# the evaluations that are kernels of mmwf's own (Triton): they run in eager and compiled code; a traced or exported
# graph, where they have no form (TorchScript, ONNX), takes its implementation's entry (the reference evaluation)
OWN_KERNELS = frozenset({'triton', 'fused'})

# a memory-bound pass over the elements of a weight formed per sample, in multiply-adds of the matrix products'
# throughput, by device type: measured on CPU cores; none on CUDA, where the materialized form was the faster or
# within 2 % of it in every case timed (H200, fp32, WF-T's first Bilateral update at 224 / batch 64 and at 1024 and
# 1248 / batch 8, inference and training: docs/cuda_check/h200_first_run); and the passes it takes: its norms and
# update, and with autograd their backward and the static weight's gradient summed over the batch
ELEMENT_PASS_COST = MappingProxyType({'cpu': 8, 'cuda': 0})
ELEMENT_PASSES = MappingProxyType({False: 3, True: 12})

# the form whose multiply-adds another form's are: the fused kernel computes the factored form's products
FORM_COSTS = MappingProxyType({'fused': 'factored'})


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


@dataclass(frozen=True)
class BlockFusion:
    """How one call of a block may evaluate across its modules: ``across``, no forward hook could see an
    intermediate (:func:`has_forward_hooks`), so a layer's kernel may add the block's shortcut or apply its
    activation; ``inplace``, also autograd records nothing, so fresh outputs are overwritten (activations, residual
    adds). ``BlockFusion()``: every module as it is, nothing overwritten."""
    across: bool = False
    inplace: bool = False

    @classmethod
    def of(cls, block: nn.Module) -> BlockFusion:
        """The fusion a call of ``block`` may take now (its hooks, grad mode)."""
        across = not has_forward_hooks(block)
        return cls(across, across and not torch.is_grad_enabled())

    def shortcut(self, layer: nn.Module, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """x + layer(x, hw) for tokens x (B, H*W, C): in the layer's own evaluation where ``across``
        (``residual=True``: the Triton kernel's one pass, or one add on its fresh output), else as two steps."""
        return layer(x, hw, residual=True) if self.across else layer(x, hw) + x

    def add(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y + x, for a fresh branch output y: in place on y where ``inplace``."""
        return y.add_(x) if self.inplace else y + x


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


def table_entry(where: str, operation: str, device_type: str | None = None, autograd: bool = False) -> str:
    """The :data:`KERNELS` entry of ``operation`` for implementation ``where`` on ``device_type`` (None: the entry
    for any device), with or without ``autograd``: the most specific of ``<operation>_<device>_autograd``,
    ``<operation>_<device>`` and ``<operation>``."""
    kernels = KERNELS[where]
    if device_type is None:
        return kernels[operation]
    on_device = kernels.get(f'{operation}_{device_type}', kernels[operation])
    return kernels.get(f'{operation}_{device_type}_autograd', on_device) if autograd else on_device


def kernel(operation: str, device: torch.device | None = None, autograd: bool = False) -> str:
    """The table's entry for ``operation`` (a column of :data:`KERNELS`) under the running :func:`implementation`,
    on ``device`` (its type, or the one :func:`resolved_as` names) and with or without ``autograd``: what
    :func:`choose_kernel` starts from for ``'auto'``, before sizes and costs settle ``'...-static'`` and
    ``'cheaper'``. ``device`` None: the entry for any device."""
    device_type = None if device is None else _resolved_as or device.type
    return table_entry(implementation(), operation, device_type, autograd)


def static_sizes(*sizes: object) -> bool:
    """Whether ``sizes`` are Python ints: torch.export's dynamic dimensions (and what is counted from them) are
    symbolic, and a graph must then serve every size."""
    return all([isinstance(s, int) for s in sizes])


# an operation -> its evaluations (CHOICES' values): a cost rule between two takes the first on a tie
EVALUATIONS = MappingProxyType({operation: values for operation, values in CHOICES.values()})


def cheaper_evaluation(operation: str, costs: Mapping[str, int]) -> str:
    """The evaluation of ``operation`` (``'product_order'``, ``'outer_product'``) with the fewer multiply-adds
    (``costs``: evaluation -> count), the first of its two (:data:`EVALUATIONS`) on a tie."""
    first, second = EVALUATIONS[operation]
    return first if costs[first] <= costs[second] else second


def _resolve(operation: str, choice: str, device: torch.device | None, autograd: bool, costs: Mapping | None,
             batch: int | None, order: str, weight_elements: int) -> str | tuple[str, str]:
    """:func:`choose_kernel`'s answer, unrecorded (the cost rule of ``'dynamic_weight'`` asks it for its orders)."""
    if choice in OWN_KERNELS and implementation() not in ('eager', 'compiled'):
        choice = 'auto'  # a traced or exported graph keeps the reference evaluation of its entry
    chosen = kernel(operation, device, autograd) if choice == 'auto' else choice
    if operation == 'dynamic_weight':  # the form, with the order within it
        forms = ('factored', 'materialized') if chosen == 'cheaper' else (chosen,)
        orders = {f: _resolve('product_order', order, device, autograd, costs[FORM_COSTS.get(f, f)], None, 'auto', 0)
                  for f in forms}
        if chosen == 'cheaper':
            factored, materialized = (costs[f][orders[f]] for f in forms)
            device_type = 'cpu' if device is None else _resolved_as or device.type
            charge = ELEMENT_PASS_COST.get(device_type, ELEMENT_PASS_COST['cpu'])
            passes = charge * ELEMENT_PASSES[autograd] * weight_elements
            chosen = 'factored' if factored <= materialized + passes else 'materialized'
        return chosen, orders[chosen]
    if chosen == 'grouped-static':
        chosen = 'grouped' if static_sizes(batch) else 'taps'
    if chosen == 'cheaper-static':
        chosen = 'cheaper' if static_sizes(*costs.values()) else 'core'
    if chosen == 'cheaper':
        chosen = cheaper_evaluation(operation, costs)
    return chosen


# what choose_kernel answered in a recorded_kernels block: (operation, the layer's choice, the kernel)
_recorded: list[tuple[str, str | tuple[str, str], str | tuple[str, str]]] | None = None


def choose_kernel(operation: str, choice: str = 'auto', device: torch.device | None = None, autograd: bool = False,
                  *, costs: Mapping | None = None, batch: int | None = None, order: str = 'auto',
                  weight_elements: int = 0) -> str | tuple[str, str]:
    """The kernel that evaluates ``operation`` in a layer whose choice for it is ``choice``: the one rule.

    An explicit choice is kept, except mmwf's Triton kernels (:data:`OWN_KERNELS`) in traced and exported graphs,
    which have no form for them (they take ``'auto'``). ``'auto'`` takes the :data:`KERNELS` entry of the running
    :func:`implementation` on ``device`` with or without ``autograd`` (:func:`kernel`); ``'grouped-static'`` and
    ``'cheaper-static'`` then read the sizes (a symbolic size takes the kernel that serves every size: the taps, the
    core's order), and ``'cheaper'`` the costs (the first evaluation on a tie; ``'factored'`` before
    ``'materialized'``, each in its own cheaper order, the materialized form charged its passes over the weight).

    Args:
        operation (str): a column of :data:`KERNELS`, the operation of one of :data:`CHOICES`.
        choice (str): the layer's choice, ``'auto'`` or one of the operation's evaluations. Defaults to ``'auto'``.
        device (torch.device, optional): the device the operation runs on (its type, or the one
            :func:`resolved_as` names, picks the entry and the charge of a formed weight). Defaults to None (the
            entry for any device).
        autograd (bool): whether autograd records the operation (training). Defaults to False.
        costs (Mapping, optional): the multiply-adds per sample that ``'cheaper'`` compares. ``'product_order'``:
            ``{'tokens': ..., 'core': ...}``; ``'outer_product'``: ``{'left': ..., 'right': ...}`` (the first on a
            tie); ``'dynamic_weight'``: ``{'factored': {...}, 'materialized': {...}}``, each by order.
        batch (int, optional): ``'depthwise_conv'``: the batch size B, an int unless a graph keeps it symbolic.
        order (str): ``'dynamic_weight'``: the layer's ``order`` choice, taken within each form. Defaults to
            ``'auto'``.
        weight_elements (int): ``'dynamic_weight'``: Cin * Cout, the elements of a weight formed per sample, each
            pass over which the device charges (:data:`ELEMENT_PASS_COST`, :data:`ELEMENT_PASSES`). Defaults to 0.

    Returns:
        str | tuple[str, str]: the kernel (``'depthwise_conv'``: ``'loop'``, ``'grouped'``, ``'taps'``,
        ``'shift'`` or ``'triton'``; ``'adaptive_pool'``: ``'native'``, ``'matrices'`` or ``'tokens'``;
        ``'product_order'``: ``'tokens'`` or ``'core'``; ``'weight_update'``: ``'addcdiv'`` or ``'div-add'``;
        ``'outer_product'``: ``'left'`` or ``'right'``); for ``'dynamic_weight'`` the pair (form, order), chosen
        together: ``'factored'``, ``'materialized'`` or ``'fused'``, and ``'tokens'`` or ``'core'``.
    """
    chosen = _resolve(operation, choice, device, autograd, costs, batch, order, weight_elements)
    if _recorded is not None:
        _recorded.append((operation, (choice, order) if operation == 'dynamic_weight' else choice, chosen))
    return chosen


@contextmanager
def recorded_kernels() -> Iterator[list[tuple[str, str | tuple[str, str], str | tuple[str, str]]]]:
    """The kernels the layers choose in the block, in order: a list of (operation, the layer's choice, the kernel
    :func:`choose_kernel` returned; for ``'dynamic_weight'`` the choices and the kernels of form and order), filled
    as the block runs (docs/kernel_choice.md)."""
    global _recorded
    saved, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = saved


def kernel_table() -> str:
    """:data:`KERNELS` as a markdown table (docs/kernel_choice.md prints it): a row per implementation, split by the
    device types its entries name (then any other device) and by autograd where that changes an entry; a column per
    operation, headed by the layer choice that resolves by it."""
    operations = {operation: name for name, (operation, _) in CHOICES.items()}
    header = ['implementation', 'device', 'autograd', *(f'`{op}` (`{name}`)' for op, name in operations.items())]
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for where, kernels in KERNELS.items():
        devices = sorted({key[len(op) + 1:].removesuffix('_autograd') for key in kernels for op in operations
                          if key.startswith(f'{op}_')})
        for device in [*devices, None]:
            label = f'`{device}`' if device else 'any other' if devices else 'any'
            cells = {grad: [table_entry(where, op, device, grad) for op in operations] for grad in (False, True)}
            rows = [('either', cells[False])] if cells[False] == cells[True] else [('no', cells[False]),
                                                                                     ('yes', cells[True])]
            for grad, row in rows:
                lines.append(f'| `{where}` | {label} | {grad} | ' + ' | '.join(f'`{c}`' for c in row) + ' |')
    return '\n'.join(lines) + '\n'
