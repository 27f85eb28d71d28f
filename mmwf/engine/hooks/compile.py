"""The configs' compiled training: named parts of the model compiled in place on the GPU, the rest eager."""
from __future__ import annotations

from collections.abc import Sequence

import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmwf.models.layers import has_forward_hooks
from mmwf.registry import HOOKS

MODES = ('default', 'reduce-overhead', 'max-autotune', 'eager')


@HOOKS.register_module()
class CompileHook(Hook):
    """Compiles the named parts of the model (``nn.Module.compile``: in place, so their keys, checkpoints and hooks
    are unchanged) before the run, on the device types listed: the dense configs' backbone and neck (mmdet's and
    mmseg's heads stay eager), the ImageNet configs' backbone, the generation configs' denoiser. On other devices
    (the CPU) the run is eager, and so is a part that carries forward hooks (the distiller's on its student).
    ``mode='eager'`` turns it off: ``--cfg-options default_hooks.compile.mode=eager``.

    mmengine's own ``compile=True`` compiles the whole ``train_step`` (data preprocessor, heads and losses included),
    whose data-dependent heads break the graph; this compiles what is one graph (``tests/models/test_compile.py``).

    Args:
        modules (Sequence[str]): attribute paths from the model, e.g. ``['backbone', 'neck']`` or
            ``['student.backbone']``.
        mode (str): ``torch.compile``'s mode (``'default'``, ``'reduce-overhead'``: CUDA graphs, ``'max-autotune'``)
            or ``'eager'``. Defaults to ``'default'``.
        devices (Sequence[str]): device types where it compiles. Defaults to ``('cuda',)``.
        backend (str): ``torch.compile``'s backend. Defaults to ``'inductor'``.
    """

    priority = 'VERY_HIGH'

    def __init__(self, modules: Sequence[str], mode: str = 'default', devices: Sequence[str] = ('cuda',),
                 backend: str = 'inductor') -> None:
        if mode not in MODES:
            raise ValueError(f'CompileHook: mode={mode!r} is not one of {MODES} '
                             '(default_hooks.compile.mode; eager turns compiling off)')
        if isinstance(modules, str) or not modules:
            raise ValueError(f'CompileHook: modules must be a list of attribute paths of the model, e.g. '
                             f"['backbone', 'neck'], got {modules!r}")
        self.modules, self.mode, self.devices, self.backend = list(modules), mode, tuple(devices), backend

    def parts(self, model: nn.Module) -> dict[str, nn.Module]:
        """The modules named by ``modules``, each checked to exist."""
        parts = {}
        for path in self.modules:
            part = model
            for name in path.split('.'):
                if not hasattr(part, name):
                    raise ValueError(f'CompileHook: the model ({type(model).__name__}) has no {path!r} to compile '
                                     f'({type(part).__name__} has no {name!r}); set default_hooks.compile.modules to '
                                     'its parts, or default_hooks.compile.mode=eager')
                part = getattr(part, name)
            if not isinstance(part, nn.Module):
                raise ValueError(f'CompileHook: {path!r} of the model is a {type(part).__name__}, not a module')
            parts[path] = part
        return parts

    def before_run(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        parts = self.parts(model)  # checked on every device, so that a config's mistake shows on the CPU too
        device = next(model.parameters()).device.type
        if self.mode == 'eager' or device not in self.devices:
            why = 'mode eager' if self.mode == 'eager' else f'the model is on {device}; it compiles on {self.devices}'
            runner.logger.info(f'CompileHook: {", ".join(parts)} eager ({why})')
            return
        options = dict(backend=self.backend) if self.mode == 'default' else dict(backend=self.backend, mode=self.mode)
        hooked = [path for path, part in parts.items() if has_forward_hooks(part)]
        if hooked:  # what a hook sees (the distiller's attention outputs) stays as eager computes it
            runner.logger.info(f'CompileHook: {", ".join(hooked)} eager: forward hooks read inside it')
        compiled = [path for path in parts if path not in hooked]
        for path in compiled:
            parts[path].compile(**options)
        if compiled:
            runner.logger.info(f'CompileHook: {", ".join(compiled)} compiled (torch.compile {options}); the first '
                               'iterations of each input size compile (default_hooks.compile.mode=eager runs eager)')
