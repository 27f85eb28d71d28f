"""How a run follows the number of processes (GPUs) it is started on: each reference's per-rank seed, and its rule
for the batch and the learning rate when the GPU count differs from its own (``docs/protocol.md``, "Several GPUs").

A config states its reference's global batch and rule in mmengine's ``auto_scale_lr`` (``base_batch_size``; ``rule``,
mmwf's key, 'linear' by default) and its per-rank seed in :class:`~mmwf.engine.hooks.WorldSizeHook`.
"""
from __future__ import annotations

import os
from collections.abc import Callable

from mmengine.config import Config

SEED_RULES: dict[str, Callable[[int, int, int], int]] = {
    # the WeightFormer release (main.py:120), detectron2 (engine/defaults.py:244): a distinct stream per rank
    'seed + rank': lambda seed, rank, world_size: seed + rank,
    # DiT (train.py:121, sample_ddp.py:57): distinct per rank, and no overlap between two global seeds
    'seed * world_size + rank': lambda seed, rank, world_size: seed * world_size + rank,
    # Vim seg/train.py:124-129, ViT-Adapter detection/train.py (mmdet / mmseg 0.x): one seed on every rank
    'seed': lambda seed, rank, world_size: seed,
}

BATCH_RULES = {
    # the WeightFormer release (main.py:126-134): lr, warm-up lr and minimum lr x global batch / reference batch
    # (mmdet's and mmseg's linear rule, which mmengine applies to the lr only)
    'linear': 'lr and every absolute minimum lr x global batch / base_batch_size',
    # DiT (train.py:118, 174): the global batch stays, the per-GPU batch is base_batch_size / world size
    'global_batch': 'per-GPU batch = base_batch_size / (world size x accumulative_counts), lr unchanged',
}


def rank_seed(rule: str, seed: int, rank: int, world_size: int) -> int:
    """The seed of ``rank`` of ``world_size`` processes under the reference's ``rule`` (:data:`SEED_RULES`)."""
    if rule not in SEED_RULES:
        raise ValueError(f'seed_rule {rule!r} is not one of {sorted(SEED_RULES)}')
    return SEED_RULES[rule](seed, rank, world_size)


def launcher_world_size(launcher: str) -> int:
    """The number of processes a launcher starts, read from what it sets in the environment before
    torch.distributed starts (as mmengine's ``init_dist`` reads it): torchrun ``WORLD_SIZE``, slurm
    ``SLURM_NTASKS``, mpi ``OMPI_COMM_WORLD_SIZE``; 1 without a launcher."""
    variable = {'pytorch': 'WORLD_SIZE', 'slurm': 'SLURM_NTASKS', 'mpi': 'OMPI_COMM_WORLD_SIZE'}.get(launcher)
    if variable is None:
        return 1
    if variable not in os.environ:
        raise RuntimeError(f'--launcher {launcher}: {variable} is not set; start the tool with '
                           f'{"torchrun / tools/dist_train.sh" if launcher == "pytorch" else launcher}')
    return int(os.environ[variable])


def accumulative_counts(cfg: Config) -> int:
    """Iterations per optimizer step (``optim_wrapper.accumulative_counts``, 1 when absent)."""
    return int(cfg.get('optim_wrapper', {}).get('accumulative_counts', 1))


def global_batch(world_size: int, per_gpu: int, accumulated: int) -> int:
    """Images (or latents) per optimizer step: world size x per-GPU batch x accumulated iterations."""
    return world_size * per_gpu * accumulated


def config_global_batch(cfg: Config, world_size: int) -> int:
    """:func:`global_batch` of a config's train loader and optimizer wrapper on ``world_size`` processes."""
    return global_batch(world_size, int(cfg.train_dataloader.batch_size), accumulative_counts(cfg))


def schedules_lr(scheduler: dict) -> bool:
    """Whether a parameter scheduler config schedules the learning rate (mmengine's ``*LR`` types, or a generic one
    with ``param_name='lr'``), not the momentum or the weight decay."""
    kind = str(scheduler.get('type', ''))
    return kind.endswith('LR') or (scheduler.get('param_name') == 'lr' and not kind.endswith('Momentum'))


def scale_to_world(cfg: Config, world_size: int) -> list[str]:
    """Apply the config's reference rule (``auto_scale_lr.rule``, :data:`BATCH_RULES`) for ``world_size``
    processes, as ``tools/train.py --auto-scale-lr`` does; return what changed, one line each, for the log.

    'linear' scales the optimizer's lr and the absolute ``eta_min`` of every lr scheduler (:func:`schedules_lr`; not
    those of weight-decay or momentum schedules; a relative warm-up follows the lr by itself) by the global batch
    (accumulation included) over ``base_batch_size``; 'global_batch' sets the per-GPU batch so that the global batch
    is ``base_batch_size``. mmengine's own scaling (lr only, accumulation not counted) is then switched off:
    ``auto_scale_lr.enable`` is False and ``auto_scale_lr.scaled_for`` records the world size."""
    scaling = cfg.get('auto_scale_lr')
    if not scaling or 'base_batch_size' not in scaling:
        raise ValueError('--auto-scale-lr: the config has no auto_scale_lr.base_batch_size (the global batch of its '
                         'reference); add auto_scale_lr = dict(enable=False, base_batch_size=N)')
    rule, base = scaling.get('rule', 'linear'), int(scaling['base_batch_size'])
    if rule not in BATCH_RULES:
        raise ValueError(f'auto_scale_lr.rule {rule!r} is not one of {sorted(BATCH_RULES)}')
    changes = []
    if rule == 'global_batch':
        per_step = global_batch(world_size, 1, accumulative_counts(cfg))
        if base % per_step:
            raise ValueError(f'auto_scale_lr: the global batch {base} cannot be split over {world_size} processes x '
                             f'{accumulative_counts(cfg)} accumulated iterations; start a number of processes that '
                             f'divides it (DiT asserts the same)')
        old = cfg.train_dataloader.batch_size
        cfg.train_dataloader.batch_size = base // per_step
        changes.append(f'train_dataloader.batch_size {old} -> {base // per_step} (global batch {base} over '
                       f'{world_size} processes)')
    else:
        ratio = config_global_batch(cfg, world_size) / base
        optimizer = cfg.optim_wrapper.optimizer
        changes.append(f'optimizer lr {optimizer.lr:g} -> {optimizer.lr * ratio:g} (x {ratio:g}: global batch '
                       f'{config_global_batch(cfg, world_size)} / {base})')
        optimizer.lr *= ratio
        schedulers = cfg.get('param_scheduler') or []
        for i, scheduler in enumerate(schedulers if isinstance(schedulers, list) else [schedulers]):
            if scheduler.get('eta_min') and schedules_lr(scheduler):
                changes.append(f'param_scheduler[{i}] ({scheduler.type}) eta_min {scheduler.eta_min:g} -> '
                               f'{scheduler.eta_min * ratio:g}')
                scheduler.eta_min *= ratio
    changes += scale_iterations(cfg, world_size, base)
    scaling.enable, scaling.scaled_for = False, world_size
    return changes


def iteration_based(cfg: Config) -> bool:
    """Whether the config's training loop counts iterations (``IterBasedTrainLoop`` or ``by_epoch=False``)."""
    train_cfg = cfg.get('train_cfg') or {}
    return 'max_iters' in train_cfg and (str(train_cfg.get('type', '')).startswith('IterBased')
                                         or train_cfg.get('by_epoch') is False or 'type' not in train_cfg)


def scaled(value: int, factor: float) -> int:
    """An iteration count or position scaled, at least 1 where it was."""
    return max(int(round(value * factor)), 1 if value else 0)


def scale_iterations(cfg: Config, world_size: int, base: int) -> list[str]:
    """An iteration-based run that sees the reference's images: with W processes x per-GPU batch n x a accumulated
    iterations (global batch g = W n a) against the reference's global batch ``base`` (one optimizer step per
    iteration), ``max_iters`` and the validation, checkpoint and logging intervals, counted in data iterations, are
    multiplied by base / (W n); the iteration schedulers' positions (``begin``, ``end``, ``milestones``), counted in
    optimizer steps (:class:`~mmwf.engine.hooks.OptimizerStepSchedulerHook`), by base / g. Epoch-based loops see the
    reference's images per epoch: nothing to do. Returns the changes, one line each."""
    if not iteration_based(cfg):
        return []
    per_iteration = world_size * int(cfg.train_dataloader.batch_size)
    accumulated = accumulative_counts(cfg)
    data, steps = base / per_iteration, base / (per_iteration * accumulated)
    if data == 1 and steps == 1:
        return []
    changes = []
    train_cfg = cfg.train_cfg
    old_max = int(train_cfg.max_iters)
    train_cfg.max_iters = scaled(old_max, data)
    changes.append(f'train_cfg.max_iters {old_max} -> {train_cfg.max_iters} (x {data:g}: {base} images per reference '
                   f'step over {per_iteration} per iteration; {train_cfg.max_iters // accumulated} optimizer steps of '
                   f'{per_iteration * accumulated} images)')
    if 'val_interval' in train_cfg:
        old = int(train_cfg.val_interval)
        # an interval past the end (no validation during training) stays past the new end
        train_cfg.val_interval = train_cfg.max_iters + old - old_max if old > old_max else scaled(old, data)
        changes.append(f'train_cfg.val_interval {old} -> {train_cfg.val_interval}')
    hooks = cfg.get('default_hooks') or {}
    checkpoint, logger = hooks.get('checkpoint') or {}, hooks.get('logger') or {}
    for name, hook in (('checkpoint', checkpoint if checkpoint.get('by_epoch', True) is False else {}),
                       ('logger', logger)):  # the logger's interval counts iterations in every loop
        if 'interval' in hook:
            old = int(hook.interval)
            hook.interval = scaled(old, data)
            changes.append(f'default_hooks.{name}.interval {old} -> {hook.interval}')
    schedulers = cfg.get('param_scheduler') or []
    for i, scheduler in enumerate(schedulers if isinstance(schedulers, list) else [schedulers]):
        if scheduler.get('by_epoch', True) or steps == 1:
            continue
        # positions in optimizer steps: a scheduler acts on steps begin .. end - 1 and reaches its end value at
        # end - 1 (mmengine's), so that last step is what scales; a milestone is the step the value changes at
        moved = dict(begin=scaled(scheduler.get('begin', 0), steps))
        if 'end' in scheduler:
            moved['end'] = scaled(int(scheduler.end) - 1, steps) + 1
        if 'milestones' in scheduler:
            moved['milestones'] = [scaled(m, steps) for m in scheduler.milestones]
        for key, value in moved.items():
            if value != scheduler.get(key, 0):
                changes.append(f'param_scheduler[{i}] ({scheduler.type}) {key} {scheduler.get(key, 0)} -> {value}')
                scheduler[key] = value
    return changes
