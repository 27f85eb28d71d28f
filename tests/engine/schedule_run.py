"""One rank of the schedule check (tests/engine/test_world.py), started by torch.distributed.run on gloo: the toy
model trained by a reference recipe scaled to this run's processes, per-GPU batch and accumulation
(:func:`mmwf.engine.world.scale_to_world`), with the hooks of mmwf's configs; rank 0 writes the lr of every
optimizer step, the optimizer steps and the images the run saw."""
import json
import os
import sys

import torch.distributed as dist
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmwf  # noqa: F401  (registers the hooks)
from mmwf.engine.hooks.optimizer_step_scheduler import optimizer_stepped
from mmwf.engine.world import scale_to_world
from tests.toy import MMWF_HOOKS, ToyData, ToyModel

# the reference: 4 images a step, 6 steps, a 3-step linear warm-up, the lr halved from step 4
REFERENCE = dict(
    train_dataloader=dict(dataset=dict(type=ToyData), sampler=dict(type='DefaultSampler', shuffle=True),
                          batch_size=4, num_workers=0, collate_fn=dict(type='default_collate')),
    optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.01), accumulative_counts=1),
    param_scheduler=[dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=3),
                     dict(type='MultiStepLR', milestones=[4], gamma=0.5, by_epoch=False, begin=0, end=6)],
    train_cfg=dict(by_epoch=False, max_iters=6),
    default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=3, by_epoch=False),
                       logger=dict(type='LoggerHook', interval=1), **MMWF_HOOKS),
    auto_scale_lr=dict(enable=False, base_batch_size=4))


class Record(Hook):
    priority = 'NORMAL'  # before the schedulers step (LOW): the lr this iteration's update used

    def __init__(self):
        self.lrs, self.images = [], 0

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.images += len(data_batch['inputs']) * runner.world_size
        if optimizer_stepped(runner):
            self.lrs.append(runner.optim_wrapper.get_lr()['lr'][0])


def main(out: str, per_gpu: str, accumulated: str) -> None:
    dist.init_process_group('gloo')
    cfg = Config(REFERENCE)
    cfg.train_dataloader.batch_size, cfg.optim_wrapper.accumulative_counts = int(per_gpu), int(accumulated)
    changes = scale_to_world(cfg, dist.get_world_size())
    record = Record()
    runner = Runner(model=ToyModel(), work_dir=out, default_scope='mmengine', randomness=dict(seed=0),
                    launcher='pytorch', env_cfg=dict(dist_cfg=dict(backend='gloo')), custom_hooks=[record],
                    cfg=dict(model_wrapper_cfg=dict(type='MMDistributedDataParallel', device_ids=None)),
                    **{k: cfg[k] for k in ('train_dataloader', 'optim_wrapper', 'param_scheduler', 'train_cfg',
                                           'default_hooks', 'auto_scale_lr')})
    runner.train()
    if dist.get_rank() == 0:
        with open(os.path.join(out, 'schedule.json'), 'w') as f:
            json.dump(dict(lrs=record.lrs, images=record.images, changes=changes), f)
    dist.destroy_process_group()


if __name__ == '__main__':
    main(*sys.argv[1:])
