"""How a run follows the number of processes (GPUs) it is started on: each reference's per-rank seed, and its rule
for the batch and the learning rate when the GPU count differs from its own (``docs/protocol.md``, "Several GPUs").

A config states its reference's global batch and rule in mmengine's ``auto_scale_lr`` (``base_batch_size``; ``rule``,
mmwf's key, 'linear' by default) and its per-rank seed in :class:`~mmwf.engine.hooks.WorldSizeHook`.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import NamedTuple

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


# what each launcher sets in a process's environment before torch.distributed starts: rank, world size, local rank
LAUNCHER_VARIABLES = {
    'pytorch': ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'),  # torchrun
    'slurm': ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID'),  # srun
    'mpi': ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_LOCAL_RANK'),  # Open MPI's mpirun
}
LAUNCHERS = ('none', *LAUNCHER_VARIABLES)  # the choices of every tool's --launcher
LAUNCHER_COMMANDS = {'pytorch': 'torchrun / tools/dist_train.sh', 'slurm': 'srun / tools/slurm_train.sh',
                     'mpi': 'mpirun'}


class LaunchedProcess(NamedTuple):
    """This process as its launcher placed it, read before any process group exists."""

    rank: int
    world_size: int
    local_rank: int


def launched_process(launcher: str) -> LaunchedProcess:
    """Rank, world size and local rank of this process from the variables its ``launcher`` set
    (:data:`LAUNCHER_VARIABLES`), as mmengine's ``init_dist`` reads them: usable before the process group exists
    (torchrun sets ``RANK``, but ``srun`` and ``mpirun`` set only their own). Without a launcher: (0, 1, 0)."""
    if launcher == 'none':
        return LaunchedProcess(0, 1, 0)
    if launcher not in LAUNCHER_VARIABLES:
        raise ValueError(f'--launcher {launcher!r} is not one of none, {", ".join(LAUNCHER_VARIABLES)}')
    missing = [name for name in LAUNCHER_VARIABLES[launcher] if name not in os.environ]
    if missing:
        raise RuntimeError(f'--launcher {launcher}: {", ".join(missing)} {"is" if len(missing) == 1 else "are"} not '
                           f'set; start the tool with {LAUNCHER_COMMANDS[launcher]}, or give the launcher that '
                           'started it')
    rank, world_size, local_rank = (int(os.environ[name]) for name in LAUNCHER_VARIABLES[launcher])
    return LaunchedProcess(rank, world_size, local_rank)


def first_slurm_host(node_list: str) -> str:
    """The first host of a Slurm node list (``node[01-04]``), by ``scontrol show hostnames`` as mmengine asks it."""
    try:
        out = subprocess.run(['scontrol', 'show', 'hostnames', node_list], capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError) as err:
        raise RuntimeError(f'--launcher slurm: `scontrol show hostnames {node_list}` failed ({err}), so the first '
                           'node, where rank 0 listens, is unknown; run under Slurm, or set MASTER_ADDR') from None
    if not out:
        raise RuntimeError(f'--launcher slurm: `scontrol show hostnames {node_list}` named no host; set MASTER_ADDR')
    return out[0]


def export_launcher_environment(launcher: str) -> LaunchedProcess:
    """Set torch.distributed's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``) from the launcher's, as mmengine's ``init_dist`` does before it joins the group on a GPU, so
    that a group joined here (gloo on the CPU) finds them: Slurm's first node of ``SLURM_NODELIST`` and port 29500
    unless ``MASTER_ADDR`` / ``MASTER_PORT`` are set; Open MPI needs ``MASTER_ADDR`` (``mpirun -x MASTER_ADDR=...``),
    as mmengine does. Returns the process (:func:`launched_process`)."""
    process = launched_process(launcher)
    if launcher in ('slurm', 'mpi'):
        if 'MASTER_ADDR' not in os.environ:
            if launcher == 'mpi':
                raise RuntimeError('--launcher mpi: MASTER_ADDR is not set; give the host of rank 0 to every process '
                                   '(mpirun -x MASTER_ADDR=HOST -x MASTER_PORT=PORT ...)')
            if 'SLURM_NODELIST' not in os.environ:
                raise RuntimeError('--launcher slurm: SLURM_NODELIST is not set; start the tool with srun')
            os.environ['MASTER_ADDR'] = first_slurm_host(os.environ['SLURM_NODELIST'])
        os.environ.setdefault('MASTER_PORT', '29500')  # torch.distributed's default, as mmengine's
        os.environ.update(RANK=str(process.rank), WORLD_SIZE=str(process.world_size),
                          LOCAL_RANK=str(process.local_rank))
    return process


def launcher_world_size(launcher: str) -> int:
    """The number of processes a launcher starts (:func:`launched_process`); 1 without a launcher."""
    return launched_process(launcher).world_size


def accumulative_counts(cfg: Config) -> int:
    """Iterations per optimizer step (``optim_wrapper.accumulative_counts``, 1 when absent)."""
    return int(cfg.get('optim_wrapper', {}).get('accumulative_counts', 1))


def global_batch(world_size: int, per_gpu: int, accumulated: int) -> int:
    """Images (or latents) per optimizer step: world size x per-GPU batch x accumulated iterations."""
    return world_size * per_gpu * accumulated


def config_global_batch(cfg: Config, world_size: int) -> int:
    """:func:`global_batch` of a config's train loader and optimizer wrapper on ``world_size`` processes."""
    return global_batch(world_size, int(cfg.train_dataloader.batch_size), accumulative_counts(cfg))


SETTING_KEY = 'mmwf_setting'  # where a checkpoint's meta records the setting of its run


def run_setting(world_size: int, per_gpu_batch: int, accumulated: int, scaling: dict | None) -> dict:
    """What a run's recipe was derived for: processes, per-GPU batch, accumulated iterations, and the world size
    ``--auto-scale-lr`` scaled it for (``scaling``: the run's ``auto_scale_lr``; None: not scaled) with the reference
    batch it scaled to."""
    scaling = scaling or {}
    return dict(world_size=int(world_size), per_gpu_batch=int(per_gpu_batch), accumulative_counts=int(accumulated),
                scaled_for=scaling.get('scaled_for'), base_batch_size=scaling.get('base_batch_size'))


def describe_setting(setting: dict) -> str:
    """A setting (:func:`run_setting`) in words."""
    scaled = (f'scaled by --auto-scale-lr for {setting["scaled_for"]} processes' if setting.get('scaled_for')
              else 'not scaled')
    return (f'{setting["world_size"]} processes x {setting["per_gpu_batch"]} images x '
            f'{setting["accumulative_counts"]} accumulated, {scaled}')


def _scaling_changes_recipe(setting: dict) -> bool:
    """Whether ``--auto-scale-lr`` changed anything for this setting: its global batch or its images per iteration
    differ from the reference batch."""
    base = setting.get('base_batch_size')
    per_iteration = setting['world_size'] * setting['per_gpu_batch']
    return bool(setting.get('scaled_for')) and base is not None and (
        per_iteration != int(base) or setting['accumulative_counts'] != 1)


def setting_mismatch(recorded: dict, current: dict) -> str | None:
    """Why a run recorded with setting ``recorded`` cannot resume under ``current`` (None: it can). Its schedulers'
    positions, the lr and the iteration reached were derived for ``recorded``; a resume under another world size,
    per-GPU batch, accumulation or scaling would go on with them and train another recipe."""
    keys = ('world_size', 'per_gpu_batch', 'accumulative_counts')
    if all(recorded.get(k) == current[k] for k in keys) and \
            _scaling_changes_recipe(recorded) == _scaling_changes_recipe(current):
        return None
    fix = (f'start it on {recorded["world_size"]} processes with train_dataloader.batch_size='
           f'{recorded["per_gpu_batch"]} and optim_wrapper.accumulative_counts={recorded["accumulative_counts"]}'
           f'{" and --auto-scale-lr" if recorded.get("scaled_for") else ", without --auto-scale-lr"}')
    return (f'the run trained with {describe_setting(recorded)}; this start has {describe_setting(current)}. Its '
            'schedulers, lr and iteration were derived for the first, so it would go on training another recipe. To '
            f'resume, {fix}. To go on from its weights under the new setting, start a new run with load_from=PATH '
            '(the schedule starts again).')


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


INF_STEP = 1_000_000_000  # mmengine's end of a scheduler without one

# How each mmengine scheduler's positions map when one reference step becomes f steps, so that its value after k
# reference steps is reached after k f: the fields that are positions ('reach'); 'last_change' when its ``end`` is one
# past the step of its last value (mmengine's linear, poly, constant and exponential reach it at end - 1), else
# ``end`` scales itself; 'gamma_per_step': an exponential factor per step becomes gamma ** (1 / f). OneCycle's phases
# end one step before pct x total_steps, so it holds within a step.
SCHEDULER_POSITIONS = {
    'Linear': dict(reach=(), last_change=True),
    'Poly': dict(reach=(), last_change=True),
    'Constant': dict(reach=(), last_change=True),
    'Exponential': dict(reach=(), last_change=True, gamma_per_step=True),
    'CosineAnnealing': dict(reach=('T_max',), last_change=False),
    'MultiStep': dict(reach=('milestones',), last_change=False),
    'Step': dict(reach=('step_size',), last_change=False),
    'OneCycle': dict(reach=('total_steps',), last_change=False),
    'CosineRestart': dict(reach=('periods',), last_change=False),
}


def scheduler_family(kind: str) -> str | None:
    """The key of :data:`SCHEDULER_POSITIONS` of a scheduler type (``LinearLR``, ``CosineAnnealingMomentum``,
    ``PolyParamScheduler``, ``mmpretrain.CosineAnnealingWeightDecay``), None for a type it does not know."""
    kind = kind.rpartition('.')[2]
    for suffix in ('ParamScheduler', 'LR', 'Momentum', 'WeightDecay', 'Lr'):
        if kind.endswith(suffix):
            kind = kind[:-len(suffix)]
            break
    return kind if kind in SCHEDULER_POSITIONS else None


def scale_scheduler(scheduler: dict, factor: float) -> tuple[list[str], str | None]:
    """Map an iteration scheduler's positions to steps ``factor`` times as many (:data:`SCHEDULER_POSITIONS`), in
    place. Returns the changes (``key old -> new``) and, for a type it does not know, why it was left alone."""
    family = scheduler_family(str(scheduler.get('type', '')))
    if family is None:
        return [], (f'{scheduler.get("type")} is not a scheduler mmwf knows how to scale (its positions stay; '
                    f'known: {", ".join(SCHEDULER_POSITIONS)})')
    rule, moved = SCHEDULER_POSITIONS[family], {}
    begin = int(scheduler.get('begin', 0))
    moved['begin'] = scaled(begin, factor)
    end = scheduler.get('end', INF_STEP)
    if end < INF_STEP:
        moved['end'] = (moved['begin'] + scaled(int(end) - begin - 1, factor) + 1 if rule['last_change']
                        else moved['begin'] + scaled(int(end) - begin, factor))
    for key in rule['reach']:
        value = scheduler.get(key)
        if value is not None:
            moved[key] = [scaled(v, factor) for v in value] if isinstance(value, (list, tuple)) else scaled(value,
                                                                                                           factor)
    if rule.get('gamma_per_step') and 'gamma' in scheduler:
        moved['gamma'] = float(scheduler['gamma']) ** (1 / factor)
    changes = []
    for key, value in moved.items():
        old = scheduler.get(key, 0 if key == 'begin' else None)
        if value != old and not (isinstance(old, (list, tuple)) and list(old) == value):
            changes.append(f'{key} {old} -> {value:.6g}' if isinstance(value, float) else f'{key} {old} -> {value}')
            scheduler[key] = value
    return changes, None


# The positions each hook type holds and what they count: 'iterations' (data iterations) or 'steps' (optimizer
# steps); a third item names the switch that makes them count epochs when true (CheckpointHook's by_epoch). A hook
# with an int interval or begin not listed here is named in the log. Hooks whose interval counts something else (a
# visualizer's test images) are listed empty.
HOOK_POSITIONS: dict[str, dict[str, tuple]] = {
    'LoggerHook': dict(interval=('iterations',)),
    'CheckpointHook': dict(interval=('iterations', 'by_epoch'), save_begin=('iterations', 'by_epoch')),
    'SafeCheckpointHook': {},
    # FlexibleEMAHook updates once per optimizer step, from step begin_iter, averaging every interval-th update
    'EMAHook': dict(begin_iter=('steps',), interval=('steps',)),
    'FlexibleEMAHook': dict(begin_iter=('steps',), interval=('steps',)),
    'DetVisualizationHook': {},
    'SegVisualizationHook': {},
    'VisualizationHook': {},
}
POSITION_KEYS = ('interval', 'begin_iter', 'save_begin', 'val_begin', 'begin')


def _hooks(cfg: Config) -> list[tuple[str, dict]]:
    """Every hook config of ``cfg`` with its path: ``default_hooks.NAME`` and ``custom_hooks[i]``."""
    found = [(f'default_hooks.{k}', v) for k, v in (cfg.get('default_hooks') or {}).items() if hasattr(v, 'get')]
    found += [(f'custom_hooks[{i}]', v) for i, v in enumerate(cfg.get('custom_hooks') or []) if hasattr(v, 'get')]
    return found


def scale_hooks(cfg: Config, factors: dict[str, float]) -> list[str]:
    """Scale every hook's positions (:data:`HOOK_POSITIONS`) by ``factors`` of their unit ('iterations', 'steps'),
    in place; name the integer positions of hooks mmwf does not know, which stay. Returns the lines for the log."""
    changes = []
    for path, hook in _hooks(cfg):
        kind = str(hook.get('type', '')).rpartition('.')[2]
        known = HOOK_POSITIONS.get(kind)
        if known is None:
            held = [k for k in POSITION_KEYS if isinstance(hook.get(k), int) and not isinstance(hook.get(k), bool)]
            if held and any(f != 1 for f in factors.values()):
                changes.append(f'{path} ({kind}) {", ".join(f"{k}={hook[k]}" for k in held)}: not scaled (mmwf '
                               'does not know whether it counts iterations or epochs); set it for this run by hand')
            continue
        for key, (unit, *epoch_switch) in known.items():
            if key not in hook or (epoch_switch and hook.get(epoch_switch[0], True)):
                continue
            old = int(hook[key])
            hook[key] = scaled(old, factors[unit])
            if hook[key] != old:
                changes.append(f'{path}.{key} {old} -> {hook[key]}')
    return changes


def iteration_schedulers(cfg: Config) -> list[tuple[int, dict]]:
    """The parameter schedulers of ``cfg`` that count iterations (optimizer steps under
    :class:`~mmwf.engine.hooks.OptimizerStepSchedulerHook`), with their index: ``by_epoch=False`` and not converted
    from epochs (those count epochs' worth of data: the same images on any number of processes)."""
    schedulers = cfg.get('param_scheduler') or []
    schedulers = schedulers if isinstance(schedulers, list) else [schedulers]
    return [(i, s) for i, s in enumerate(schedulers)
            if s.get('by_epoch', True) is False and not s.get('convert_to_iter_based')]


def check_schedule_counting(cfg: Config) -> None:
    """Refuse a config whose iteration schedulers step once per data iteration (mmengine's ``ParamSchedulerHook``)
    while its optimizer accumulates: warm-ups and decays would run ``accumulative_counts`` times too fast."""
    hook = (cfg.get('default_hooks') or {}).get('param_scheduler') or {}
    kind = str(hook.get('type', 'ParamSchedulerHook')).rpartition('.')[2]
    if accumulative_counts(cfg) > 1 and kind != 'OptimizerStepSchedulerHook' and iteration_schedulers(cfg):
        raise ValueError(f'optim_wrapper.accumulative_counts={accumulative_counts(cfg)} with {kind}: its iteration '
                         'schedulers would step once per iteration, not once per optimizer step, and end the schedule '
                         f'{accumulative_counts(cfg)} times too early. Set default_hooks.param_scheduler='
                         "dict(type='OptimizerStepSchedulerHook'), as every mmwf config does")


def scale_iterations(cfg: Config, world_size: int, base: int) -> list[str]:
    """A run that sees the reference's images: with W processes x per-GPU batch n x a accumulated iterations
    (global batch g = W n a) against the reference's global batch ``base`` (one optimizer step per iteration),
    positions counted in data iterations (an iteration-based loop's ``max_iters``, ``val_interval`` and
    ``val_begin``; every hook's iteration intervals and begins, :func:`scale_hooks`) are multiplied by base / (W n),
    and the iteration schedulers' positions, counted in optimizer steps
    (:class:`~mmwf.engine.hooks.OptimizerStepSchedulerHook`), by base / g, each by its own meaning
    (:func:`scale_scheduler`), in epoch-based loops too (their iteration warm-ups). Epochs stay: an epoch is the same
    images on any number of processes. Returns the changes, one line each; what cannot be scaled is named there."""
    check_schedule_counting(cfg)
    per_iteration = world_size * int(cfg.train_dataloader.batch_size)
    accumulated = accumulative_counts(cfg)
    data, steps = base / per_iteration, base / (per_iteration * accumulated)
    changes = []
    train_cfg = cfg.get('train_cfg') or {}
    if iteration_based(cfg) and data != 1:
        old_max = int(train_cfg.max_iters)
        train_cfg.max_iters = scaled(old_max, data)
        changes.append(f'train_cfg.max_iters {old_max} -> {train_cfg.max_iters} (x {data:g}: {base} images per '
                       f'reference step over {per_iteration} per iteration; {train_cfg.max_iters // accumulated} '
                       f'optimizer steps of {per_iteration * accumulated} images)')
        for key in ('val_interval', 'val_begin'):
            if key not in train_cfg:
                continue
            old = int(train_cfg[key])
            # an interval past the end (no validation during training) stays past the new end
            train_cfg[key] = train_cfg.max_iters + old - old_max if old > old_max else scaled(old, data)
            changes.append(f'train_cfg.{key} {old} -> {train_cfg[key]}')
    changes += scale_hooks(cfg, dict(iterations=data, steps=steps))
    if steps != 1:
        for i, scheduler in iteration_schedulers(cfg):
            moved, unknown = scale_scheduler(scheduler, steps)
            changes += [f'param_scheduler[{i}] ({scheduler.type}) {line}' for line in moved]
            if unknown:
                changes.append(f'param_scheduler[{i}]: {unknown}')
    return changes
