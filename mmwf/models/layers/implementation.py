"""How the running forward is executed, asked in one place, and the one table of the kernels the layers use under
each: an operation with several evaluations (all computing the same function) takes the fastest one in eager
PyTorch, one the tracer or exporter can translate, or one generic in the batch and grid sizes for graphs that
serve every size."""
from __future__ import annotations

import torch

# implementation -> operation -> kernel; an entry '<operation>_<device type>' overrides '<operation>' on that device
KERNELS: dict[str, dict[str, str]] = {
    'eager': dict(depthwise_conv='grouped', depthwise_conv_cpu='loop', adaptive_pool='native',
                  product_order='cheaper'),
    'traced': dict(depthwise_conv='grouped', adaptive_pool='native', product_order='cheaper'),
    'traced-onnx': dict(depthwise_conv='grouped', adaptive_pool='matrices', product_order='cheaper'),
    'compiled': dict(depthwise_conv='shift', adaptive_pool='matrices', product_order='cheaper'),
    'exported': dict(depthwise_conv='shift', adaptive_pool='matrices', product_order='core'),
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


def kernel(operation: str, device: torch.device | None = None) -> str:
    """The kernel of ``operation`` (a column of :data:`KERNELS`) under the running :func:`implementation`, on
    ``device`` when the choice depends on it.

    Args:
        operation (str): ``'depthwise_conv'`` (the per-sample depthwise conv: ``'loop'``, ``'grouped'`` or
            ``'shift'``), ``'adaptive_pool'`` (``'native'`` or ``'matrices'``) or ``'product_order'`` (the dynamic
            linears' ``order='auto'``: ``'cheaper'`` or ``'core'``).
        device (torch.device, optional): the device the operation runs on. Defaults to None (the entry for any
            device).
    """
    kernels = KERNELS[implementation()]
    return kernels.get(f'{operation}_{device.type}', kernels[operation]) if device is not None else kernels[operation]
