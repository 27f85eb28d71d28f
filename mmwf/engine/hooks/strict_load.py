"""Strict loading under any mmengine runner: ``load_from`` (test, fine-tuning) and resume stop on a checkpoint that
does not fit, before the first batch.

mmengine's runners load checkpoints with ``strict=False``: a checkpoint of another model skips every mismatched
key, and ``tools/test.py`` then reports the metric of a randomly initialised model. ``Runner`` and
``FlexibleRunner`` (all its strategies) call ``after_load_checkpoint`` between reading the file and loading the
model; this hook loads the state there (:func:`mmwf.utils.checkpoint.load_checked`, after the modules' own load
hooks) and stops on any missing, unexpected or mis-shaped key. Resuming, the saved optimizer state must fit the
parameters; evaluating or resuming, the datasets must have the classes the checkpoint was trained on.
"""
from __future__ import annotations

import os.path as osp
import re

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmwf.datasets.checks import REMAP_KEY, check_classes
from mmwf.registry import HOOKS
from mmwf.utils.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    checkpoint_problem,
    load_checked,
    mismatch_lines,
    state_dict_mismatch,
)

from .runner_state import built_datasets, fsdp_model, is_resuming, loaded_file, resume_point_missing, will_load

PARTIAL_LOAD = 'partial_load'  # the config key of the opt-out

# optimizer state entries of a parameter's own shape (Adam / AdamW / NAdam / RAdam / Adamax, SGD, RMSprop,
# Adagrad, Adadelta, ASGD, Rprop, Lion); factored or quantized states (Adafactor, 8-bit) are not compared
ELEMENTWISE_STATE = ('exp_avg', 'exp_avg_sq', 'max_exp_avg_sq', 'exp_inf', 'momentum_buffer', 'square_avg',
                     'grad_avg', 'sum', 'acc_delta', 'ax', 'prev', 'step_size')


def optimizer_state_mismatch(optimizer, saved: dict, names: dict[int, str],
                             shapes: dict[str, tuple] | None = None) -> list[str]:
    """Lines naming how a saved optimizer state does not fit ``optimizer`` (group count, parameters per group,
    shapes of the element-wise state entries); empty when it fits. ``names`` maps ``id(parameter)`` to its name;
    ``shapes`` (FSDP: the optimizer holds shards, the saved state is keyed by name) gives each name's whole shape."""
    import torch
    groups, saved_groups = optimizer.param_groups, saved.get('param_groups', [])
    if len(groups) != len(saved_groups):
        return [f'{len(saved_groups)} parameter groups in the checkpoint vs {len(groups)} here (the trainable '
                'parameters or paramwise_cfg differ)']
    lines = [f'group {i}: {len(s["params"])} parameters in the checkpoint vs {len(g["params"])} here'
             for i, (g, s) in enumerate(zip(groups, saved_groups)) if len(g['params']) != len(s['params'])]
    if lines:
        return lines
    state = saved.get('state', {})
    wrong = []
    for group, saved_group in zip(groups, saved_groups):
        for param, pid in zip(group['params'], saved_group['params']):
            name = names.get(id(param), '?')
            expected = tuple(param.shape) if shapes is None else shapes.get(pid, shapes.get(name))
            for key, value in state.get(pid, {}).items():
                if (key in ELEMENTWISE_STATE and isinstance(value, torch.Tensor) and expected is not None
                        and tuple(value.shape) != expected):
                    wrong.append(f'{name} ({key}): checkpoint {tuple(value.shape)} vs parameter {expected}')
    return [f'state shape mismatches ({len(wrong)}): {", ".join(wrong[:8])}{" ..." if len(wrong) > 8 else ""}'
            ] if wrong else []


def fsdp_state(model) -> tuple[dict, bool]:
    """The state dict of a model that FSDP shards, in the layout its strategy saves and loads, and whether that is
    the whole (unsharded) one, gathered then on every process. A collective call: every process loading the
    checkpoint makes it."""
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    if FSDP.get_state_dict_type(model).state_dict_type != StateDictType.FULL_STATE_DICT:
        return model.state_dict(), False
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=False)):
        return model.state_dict(), True


def _hints(own: set[str], state: set[str]) -> list[str]:
    """What a mismatched checkpoint probably is, and what to do with it."""
    if any(k.startswith('student.') for k in state) and not any(k.startswith('student.') for k in own):
        return ['It is a distiller checkpoint: write its student as a checkpoint of its own with '
                '`python tools/model_converters/extract_student.py SRC DST`.']
    if state and sum(f'backbone.{k}' in own for k in state) >= len(state) / 2:
        return ["It is a backbone checkpoint: give it to the backbone instead, "
                "model.backbone.init_cfg=dict(type='Pretrained', checkpoint=PATH)."]
    return []


@HOOKS.register_module()
class StrictLoadHook(Hook):
    """Load checkpoints strictly under any runner (module docstring). The config key ``partial_load=True`` loads
    only the matching tensors instead (fine-tuning with another head), listing the keys left out.

    Args:
        revise_keys (list): (pattern, replacement) pairs applied to the checkpoint's keys, as mmengine's
            ``load_checkpoint``. Defaults to ``[(r'^module\\.', '')]``, mmengine's.
    """

    priority = 'VERY_HIGH'

    def __init__(self, revise_keys: list | None = None) -> None:
        self.revise_keys = revise_keys if revise_keys is not None else [(r'^module\.', '')]

    def before_run(self, runner) -> None:
        """Before ``Runner`` loads (``FlexibleRunner`` loads before its hooks run): a checkpoint that cannot be read
        is one error naming the file, what is wrong and the fix."""
        if not will_load(runner):
            return
        path = loaded_file(runner)
        if osp.isfile(path):
            problem = checkpoint_problem(path, allowed=[])  # what mmengine's loader, torch's defaults, accepts
            if problem is not None:
                raise problem

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        filename = loaded_file(runner)
        state = checkpoint.get('state_dict', checkpoint)
        if not isinstance(state, dict):
            raise CheckpointError(f'cannot read checkpoint {filename!r}: it is not a state dict (found '
                                  f'{type(state).__name__}).')
        for pattern, replacement in self.revise_keys:
            state = {re.sub(pattern, replacement, k): v for k, v in state.items()}
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        partial = bool(runner.cfg.get(PARTIAL_LOAD, False))
        for module in model.modules():  # the backbones' own guard (a load giving them nothing) honours the opt-out
            if hasattr(module, PARTIAL_LOAD):
                setattr(module, PARTIAL_LOAD, partial)
        fsdp, own, shapes = fsdp_model(runner), None, None
        if fsdp is None:
            mismatch = load_checked(model, state)
        else:  # FSDP: compared in the layout it saves; FSDPStrategy loads the state through FSDP after this hook
            own, whole = fsdp_state(fsdp)
            mismatch = state_dict_mismatch(own, state)
            if whole:
                shapes = {k: tuple(v.shape) for k, v in own.items()}
            if 'state_dict' in checkpoint:  # what fits, as load_checked loads it
                checkpoint['state_dict'] = {k: v for k, v in state.items()
                                            if k not in own or v.shape == own[k].shape}
        if mismatch and partial:
            runner.logger.warning('\n'.join([f'{PARTIAL_LOAD}=True: loaded only the tensors of {filename} that match '
                                             'the model; left out:', *mismatch_lines(mismatch)]))
        elif mismatch:
            raise CheckpointMismatchError('\n'.join([
                f'checkpoint {filename!r} does not match the model of this config ({type(model).__name__}); the run '
                'stops before the first batch.', *mismatch_lines(mismatch),
                *_hints(set(model.state_dict() if own is None else own), set(state)),
                'Use the checkpoint this config trained. To load only the matching tensors on purpose (fine-tuning '
                f'with another head), set {PARTIAL_LOAD}=True (--cfg-options {PARTIAL_LOAD}=True).']))
        resuming = is_resuming(runner)
        if resuming:
            missing = resume_point_missing(checkpoint, runner.param_schedulers is not None)
            if missing:
                raise CheckpointError(
                    f'cannot resume from {filename!r}: it is not a resume point: it lacks the {", ".join(missing)} '
                    'state (a best checkpoint, which mmengine writes without optimizer and schedulers, or an EMA or '
                    'weights-only file). Resume from a full checkpoint of the run (iter_N.pth / epoch_N.pth; '
                    '--resume alone takes the newest), or start a new run from its weights with load_from=PATH '
                    '(no --resume).')
            self._check_optimizer(runner, model, checkpoint['optimizer'], filename, shapes)
        trained = ((checkpoint.get('meta') or {}).get('dataset_meta') or {}).get('classes')
        splits = built_datasets(runner)
        if trained and (resuming or 'train' not in splits):
            check_classes(splits, model, (filename, list(trained)), remap=bool(runner.cfg.get(REMAP_KEY, False)))

    @staticmethod
    def _check_optimizer(runner, model, saved: dict, filename: str, shapes: dict[str, tuple] | None) -> None:
        from mmengine.optim import OptimWrapper, OptimWrapperDict
        wrapper = runner.optim_wrapper
        if not isinstance(wrapper, (OptimWrapper, OptimWrapperDict)):  # not built: nothing to compare with
            return
        names = {id(p): n for n, p in model.named_parameters()}
        wrappers = wrapper.optim_wrappers if isinstance(wrapper, OptimWrapperDict) else {'': wrapper}
        for key, each in wrappers.items():
            mismatch = optimizer_state_mismatch(each.optimizer, saved[key] if key else saved, names, shapes)
            if mismatch:
                raise CheckpointMismatchError('\n'.join([
                    f'cannot resume from {filename!r}: its optimizer state{f" ({key})" if key else ""} does not '
                    'fit the parameters of this config.', *mismatch,
                    'Resume with the config the checkpoint was trained with, or start a new run from its '
                    'weights with load_from=PATH (no --resume).']))
