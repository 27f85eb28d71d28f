"""Starting a run of a config, as ``tools/train.py`` and ``tools/test.py`` do."""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from mmengine.config import Config

from mmwf.datasets.checks import annotation_file_error, check_dataset_paths
from mmwf.utils.checkpoint import checkpoint_problem
from mmwf.utils.runtime import adapt_to_device, init_cpu_distributed

# the FlexibleRunner strategies that shard the model over a process group (mmengine's and mmwf's)
SHARDING_STRATEGIES = ('FSDP', 'DeepSpeed', 'ColossalAI')


def check_launcher(cfg: Config) -> None:
    """Refuse, before any work, a config whose strategy shards the model over processes (FSDP, DeepSpeed) started
    without a launcher, where torch would stop at the first collective with "default process group has not been
    initialized"."""
    kind = str((cfg.get('strategy') or {}).get('type', ''))
    if cfg.get('launcher', 'none') == 'none' and any(name in kind for name in SHARDING_STRATEGIES):
        raise ValueError(f'{cfg.filename}: strategy {kind} shards the model over processes and needs a launcher: '
                         f'bash tools/dist_train.sh {cfg.filename} GPUS (torchrun; 1 GPU works too), or '
                         'tools/slurm_train.sh; the config without _fsdp trains on one process')


def build_runner(cfg: Config, splits: tuple[str, ...]):
    """Check the data of ``splits``, adapt the config to the device, start CPU distribution if asked, and build the
    config's runner (mmengine's ``Runner`` unless the config names another ``runner_type``, e.g. ``FlexibleRunner``).
    A checkpoint to load that cannot be read is named here for runners that load before their hooks run
    (``FlexibleRunner``); ``Runner`` leaves it to :class:`~mmwf.engine.hooks.StrictLoadHook`. What following the
    image size did when the tool loaded the config (:func:`mmwf.configs.record_followed`) goes to the runner's log."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    from mmwf.configs import formatted_once, take_followed
    from mmwf.engine.runner import log_followed

    followed = take_followed(cfg)
    check_launcher(cfg)
    check_dataset_paths(cfg, splits)
    adapt_to_device(cfg)
    init_cpu_distributed(cfg)
    runner = RUNNERS.build(formatted_once(cfg))  # the config text formatted once, not at each use
    log_followed(runner.logger, followed)
    path = cfg.get('load_from')
    if not isinstance(runner, Runner) and path and '://' not in str(path):
        problem = checkpoint_problem(str(path), allowed=[])  # what mmengine's loader, torch's defaults, accepts
        if problem is not None:
            raise problem
    return runner


@contextmanager
def restored_state(runner) -> Iterator[None]:
    """Run a block (``runner.train()``, ``runner.test()``) and put back the process-wide state the runner's hooks set
    for the run however it ends: mmengine calls ``after_run`` only when a run ends without an error, so each hook's
    ``restore_process_state`` (:class:`~mmwf.engine.hooks.TF32Hook`'s flags) runs here in ``finally``."""
    try:
        yield
    finally:
        for hook in getattr(runner, 'hooks', []):
            if callable(getattr(hook, 'restore_process_state', None)):
                hook.restore_process_state()


@contextmanager
def named_annotation_errors(cfg: Config) -> Iterator[None]:
    """An annotation file that is not valid JSON, found while the run builds its datasets or metrics, named with its
    path, line and column (mmdet's and mmengine's readers raise the bare JSON error)."""
    try:
        yield
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        for key in ('train_dataloader', 'val_dataloader', 'test_dataloader', 'val_evaluator', 'test_evaluator'):
            named = annotation_file_error(cfg.get(key) or {})
            if named is not None:
                raise named from err
        raise
