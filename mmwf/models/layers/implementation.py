"""How the running forward is executed, asked in one place, and the one table of the kernels the layers use under
each: an operation with several evaluations (all computing the same function) takes the fastest one in eager
PyTorch, one the tracer or exporter can translate, or one generic in the batch and grid sizes for graphs that
serve every size."""
from __future__ import annotations

import torch

# implementation -> operation -> kernel; an entry '<operation>_<device type>' overrides '<operation>' on that device,
# and '<operation>_<device type>_autograd' that entry where autograd records the operation (training)
KERNELS: dict[str, dict[str, str]] = {
    'eager': dict(depthwise_conv='grouped', depthwise_conv_cpu='loop', depthwise_conv_cpu_autograd='grouped',
                  adaptive_pool='native', adaptive_pool_cuda='matrices-large', adaptive_pool_cuda_autograd='native',
                  product_order='cheaper', dynamic_weight='cheaper', weight_update='addcdiv'),
    'traced': dict(depthwise_conv='grouped', adaptive_pool='native', product_order='cheaper',
                   dynamic_weight='materialized', weight_update='addcdiv'),
    'traced-onnx': dict(depthwise_conv='taps', adaptive_pool='matrices', product_order='cheaper',
                        dynamic_weight='materialized', weight_update='div-add'),
    'compiled': dict(depthwise_conv='shift', adaptive_pool='matrices', product_order='cheaper',
                     dynamic_weight='cheaper', weight_update='addcdiv'),
    'exported': dict(depthwise_conv='grouped-static', adaptive_pool='matrices', product_order='cheaper-static',
                     dynamic_weight='materialized', weight_update='addcdiv'),
}


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


def kernel(operation: str, device: torch.device | None = None, autograd: bool = False) -> str:
    """The kernel of ``operation`` (a column of :data:`KERNELS`) under the running :func:`implementation`, on
    ``device`` and with or without ``autograd`` when the choice depends on them.

    Args:
        operation (str): ``'depthwise_conv'`` (the per-sample depthwise conv: ``'loop'``, ``'grouped'``,
            ``'taps'``, ``'grouped-static'`` (grouped where the batch size is static, else the taps) or
            ``'shift'``), ``'adaptive_pool'`` (``'native'``, ``'matrices'`` or ``'matrices-large'``: the
            matrices on large maps, :func:`~.dynamic_dwconv.adaptive_pool_kernel`), ``'product_order'`` (the dynamic
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
    on_device = kernels.get(f'{operation}_{device.type}', kernels[operation])
    return kernels.get(f'{operation}_{device.type}_autograd', on_device) if autograd else on_device
