"""The configs' compiled training: named parts of the model compiled in place on the GPU, the rest eager; a part whose
compiling fails runs eager, and a part past its recompile limit says so in the run's log."""
from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence

import torch
import torch._dynamo
import torch._functorch.config
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmwf.models.layers import has_forward_hooks
from mmwf.registry import HOOKS

MODES = ('default', 'reduce-overhead', 'max-autotune', 'eager')
# torch.compile's own per-call limit, counted apart from every other compiled callable (torch 2.14 has both): without
# them every part compiled by nn.Module.compile shares one code object (Module._call_impl), so one part past dynamo's
# global limit stops every part's new graphs (measured on 2.14), and the limit is set around each call instead
PER_CALL_LIMIT = {'recompile_limit', 'isolate_recompiles'} <= set(inspect.signature(torch.compile).parameters)
# AOT autograd compiles the backward at the first backward (outside the compiled call), unless this is set
EAGER_BACKWARD = hasattr(torch._functorch.config, 'force_non_lazy_backward_lowering')
DYNAMO_LOG = 'torch._dynamo.convert_frame'  # where dynamo warns 'torch._dynamo hit config.recompile_limit (8)'


def describe(error: BaseException) -> str:
    """The error's type and first line; through dynamo's wrapper (``BackendCompilerFailed``), the compiler's own."""
    inner = getattr(error, 'inner_exception', None) or error.__cause__
    name = type(error).__name__
    if inner is not None and inner is not error:
        name, error = f'{name} from {type(inner).__name__}', inner
    line = next((line.strip() for line in str(error).splitlines() if line.strip()), '')
    line = line if len(line) <= 300 else line[:297] + '...'
    return f'{name}: {line}' if line else name


class _LimitWatch(logging.Handler):
    """Keeps dynamo's recompile-limit warning, emitted while a part's compiled call runs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if 'hit config.' in message:
            self.message = message


class CompiledPart:
    """What ``nn.Module.__call__`` runs for one compiled part (``module._compiled_call_impl``): the compiled call,
    and the part's eager call where compiling fails.

    dynamo compiles at a call, for each new graph (the first training step, the first validation: eval mode without
    gradients, a new input size), so a compiler's failure surfaces inside a call, hours into a run. On any exception
    (the compiled graph running out of memory included) the call is run again eagerly: if eager raises too, the
    error is the model's own (a shape error) and eager's exception is raised; if eager works, the compiler failed:
    the part runs eager from then on (``_compiled_call_impl = None``), with one warning in the run's log.
    ``strict=True`` raises the compiled call's exception instead. The backward is compiled with the forward, inside
    the call (AOT autograd otherwise compiles it at the first ``backward()``, where no part's call could catch a
    failure).

    Side effects of the failed call: a compiler fails before the graph runs (dynamo traces on fake tensors), so no
    buffer or random draw has changed and the eager retry is the step eager would have run. Where the graph ran and
    then failed (a GPU kernel autotuned at its first launch), buffers it updates (BatchNorm's running statistics; no
    compiled part of mmwf has any) may be updated again by the retry, and random draws it took are not restored:
    they are neither saved nor restored on each call, which would cost every step a copy.
    """

    def __init__(self, module: nn.Module, path: str, compiled: Callable, strict: bool, recompile_limit: int,
                 logger: logging.Logger) -> None:
        self.module, self.path, self.compiled, self.strict = module, path, compiled, strict
        self.recompile_limit, self.logger, self.limit_warned = recompile_limit, logger, False
        self.watch, self.dynamo_log = _LimitWatch(), logging.getLogger(DYNAMO_LOG)
        # settings for the call only (nothing global changes between calls): the backward compiled with the forward,
        # and the part's recompile limit where torch.compile has no per-call one
        self.settings = []
        if EAGER_BACKWARD:
            self.settings.append((torch._functorch.config, 'force_non_lazy_backward_lowering', True))
        if not PER_CALL_LIMIT:
            name = 'recompile_limit' if hasattr(torch._dynamo.config, 'recompile_limit') else 'cache_size_limit'
            self.settings.append((torch._dynamo.config, name, recompile_limit))

    def __call__(self, *args, **kwargs):
        saved = [getattr(config, name) for config, name, _ in self.settings]
        for config, name, value in self.settings:  # attributes set and restored: a tenth of config.patch's cost
            setattr(config, name, value)
        self.dynamo_log.addHandler(self.watch)  # dynamo's recompile-limit warning, to the run's log
        try:
            return self.compiled(*args, **kwargs)
        except Exception as error:
            if self.strict:
                raise
            failure = describe(error)  # the exception (and the tensors its frames hold) is released here
        finally:
            self.dynamo_log.removeHandler(self.watch)
            for (config, name, _), value in zip(self.settings, saved):
                setattr(config, name, value)
            if self.watch.message is not None and not self.limit_warned:
                self.warn_limit(self.watch.message)
        # outside the handler: an error of the model's own propagates as eager raises it, nothing chained to it
        out = self.module._call_impl(*args, **kwargs)
        self.module._compiled_call_impl = None
        self.compiled = None
        self.logger.warning(f'CompileHook: compiling {self.path} failed ({failure}); {self.path} runs eager from '
                            'here and the run goes on. default_hooks.compile.strict=True stops at such a failure; '
                            'default_hooks.compile.mode=eager does not compile')
        return out

    def warn_limit(self, message: str) -> None:
        """Once per part: dynamo stopped compiling new graphs for it."""
        self.limit_warned = True
        lines = message.splitlines()
        reason = next((line.strip() for line in lines if 'last reason' in line), '')
        self.logger.warning(
            f'CompileHook: {self.path} reached dynamo\'s recompile limit ({self.recompile_limit} graphs; '
            f'"{lines[0].strip()}", {reason}): inputs that none of its graphs fits run eager from here, slower. '
            'Raise default_hooks.compile.recompile_limit, or set default_hooks.compile.dynamic=True where image '
            'sizes vary')


@HOOKS.register_module()
class CompileHook(Hook):
    """Compiles the named parts of the model (``nn.Module.compile``: in place, so their keys, checkpoints and hooks
    are unchanged) before the run, on the device types listed: the dense configs' backbone and neck (mmdet's and
    mmseg's heads stay eager), the ImageNet configs' backbone, the generation configs' denoiser. On other devices
    (the CPU) the run is eager, and so is a part that carries forward hooks (the distiller's on its student).
    ``mode='eager'`` turns it off: ``--cfg-options default_hooks.compile.mode=eager``.

    Compiling never ends a run unless ``strict=True``: a part whose compiling fails, at any call (the first step, the
    first validation), runs eager from then on with one warning (``CompiledPart``). Each part counts its graphs
    (training, evaluation, each input size dynamo specialises) against its own ``recompile_limit``; past it, new
    inputs run eager, and the run's log says so. (A torch whose ``torch.compile`` has no per-call limit gets the
    limit set around each call, its cache shared by the parts.)

    mmengine's own ``compile=True`` compiles the whole ``train_step`` (data preprocessor, heads and losses included),
    whose data-dependent heads break the graph; this compiles what is one graph (``tests/models/test_compile.py``).

    Args:
        modules (Sequence[str]): attribute paths from the model, e.g. ``['backbone', 'neck']`` or
            ``['student.backbone']``.
        mode (str): ``torch.compile``'s mode (``'default'``, ``'reduce-overhead'``: CUDA graphs, ``'max-autotune'``)
            or ``'eager'``. Defaults to ``'default'``.
        devices (Sequence[str]): device types where it compiles. Defaults to ``('cuda',)``.
        backend (str | Callable): ``torch.compile``'s backend. Defaults to ``'inductor'``.
        strict (bool): a failing compile raises instead of running the part eager. Defaults to False.
        dynamic (bool, optional): ``torch.compile``'s ``dynamic``: None compiles an input size's graph, then one
            generic in the sizes at the second size; True compiles the generic graph first (image sizes that vary
            from the first batch: multi-scale training, whole-image testing); False one graph per size. Defaults to
            None.
        recompile_limit (int): graphs each part may compile, training's and evaluation's together; dynamo's own
            limit is 8 for all. Defaults to 16.
    """

    priority = 'VERY_HIGH'

    def __init__(self, modules: Sequence[str], mode: str = 'default', devices: Sequence[str] = ('cuda',),
                 backend: str | Callable = 'inductor', strict: bool = False, dynamic: bool | None = None,
                 recompile_limit: int = 16) -> None:
        if mode not in MODES:
            raise ValueError(f'CompileHook: mode={mode!r} is not one of {MODES} '
                             '(default_hooks.compile.mode; eager turns compiling off)')
        if isinstance(modules, str) or not modules:
            raise ValueError(f'CompileHook: modules must be a list of attribute paths of the model, e.g. '
                             f"['backbone', 'neck'], got {modules!r}")
        if dynamic not in (None, True, False):
            raise ValueError(f'CompileHook: dynamic must be None, True or False (torch.compile), got {dynamic!r}')
        if isinstance(recompile_limit, bool) or not isinstance(recompile_limit, int) or recompile_limit < 1:
            raise ValueError(f'CompileHook: recompile_limit must be a positive int (graphs per part), got '
                             f'{recompile_limit!r}')
        self.modules, self.mode, self.devices, self.backend = list(modules), mode, tuple(devices), backend
        self.strict, self.dynamic, self.recompile_limit = bool(strict), dynamic, recompile_limit

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
        options = dict(backend=self.backend, dynamic=self.dynamic)
        if self.mode != 'default':
            options['mode'] = self.mode
        limits = dict(recompile_limit=self.recompile_limit, isolate_recompiles=True) if PER_CALL_LIMIT else {}
        hooked = [path for path, part in parts.items() if has_forward_hooks(part)]
        if hooked:  # what a hook sees (the distiller's attention outputs) stays as eager computes it
            runner.logger.info(f'CompileHook: {", ".join(hooked)} eager: forward hooks read inside it')
        compiled = [path for path in parts if path not in hooked]
        for path in compiled:
            part = parts[path]
            part.compile(**options, **limits)
            part._compiled_call_impl = CompiledPart(part, path, part._compiled_call_impl, self.strict,
                                                    self.recompile_limit, runner.logger)
        if compiled:
            runner.logger.info(
                f'CompileHook: {", ".join(compiled)} compiled (torch.compile {options}, at most '
                f'{self.recompile_limit} graphs each); the first iterations of each input size compile, and a part '
                f'whose compiling fails {"stops the run (strict)" if self.strict else "runs eager"} '
                '(default_hooks.compile.mode=eager runs eager)')
