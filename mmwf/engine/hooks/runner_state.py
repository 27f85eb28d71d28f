"""What the checkpoint and dataset hooks read from a runner. mmengine's ``Runner`` and ``FlexibleRunner`` keep it in
the same attributes; reading them here keeps every such access in one place."""
from __future__ import annotations

import os.path as osp

from mmengine.runner import BaseLoop


def is_resuming(runner) -> bool:
    """Whether the runner's checkpoint load is a resume (``resume=True``) rather than ``load_from``."""
    return bool(runner._resume)


def built_datasets(runner) -> dict[str, object]:
    """The datasets of the loops the runner has built (``'train'``, ``'val'``, ``'test'``): those of the run."""
    loops = (('train', runner._train_loop), ('val', runner._val_loop), ('test', runner._test_loop))
    return {split: loop.dataloader.dataset for split, loop in loops if isinstance(loop, BaseLoop)}



def will_load(runner) -> bool:
    """Whether the runner is yet to load a checkpoint (``load_from`` or ``resume`` set, nothing loaded so far)."""
    return not runner._has_loaded and bool(runner._load_from or runner._resume)


def loaded_file(runner) -> str:
    """The checkpoint the runner loads: its ``load_from``, else what ``last_checkpoint`` names (mmengine's
    auto-resume)."""
    if runner._load_from:
        return str(runner._load_from)
    last = osp.join(runner.work_dir, 'last_checkpoint')
    if osp.isfile(last):
        with open(last) as f:
            return f.read().strip()
    return ''


def accumulative_counts(runner) -> int:
    """Iterations per optimizer step of the runner's optimizer wrapper (its config where it is not built yet:
    ``FlexibleRunner`` loads a checkpoint before it builds the wrapper)."""
    wrapper = runner.optim_wrapper
    if isinstance(wrapper, dict):
        return int(wrapper.get('accumulative_counts', 1))
    return int(getattr(wrapper, '_accumulative_counts', 1))


def auto_scale_lr(runner) -> dict:
    """The run's ``auto_scale_lr`` settings (``Runner.auto_scale_lr``; ``FlexibleRunner`` keeps them private)."""
    return getattr(runner, 'auto_scale_lr', None) or getattr(runner, '_auto_scale_lr', None) or {}


def fsdp_model(runner):
    """The runner's model when FSDP shards it (FlexibleRunner's FSDP strategies), else None."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    return runner.model if isinstance(runner.model, FSDP) else None


RESUME_STATE = {'state_dict': 'model', 'optimizer': 'optimizer', 'message_hub': 'message hub',
                'param_schedulers': 'parameter schedulers'}


def resume_point_missing(checkpoint: dict, schedulers: bool = True) -> list[str]:
    """What of the training state a checkpoint lacks to be a resume point (empty: it is one): the model, optimizer
    and message hub, and the parameter schedulers when the run has any (``schedulers``)."""
    keys = [k for k in RESUME_STATE if schedulers or k != 'param_schedulers']
    return [RESUME_STATE[k] for k in keys if not isinstance(checkpoint, dict) or k not in checkpoint]
