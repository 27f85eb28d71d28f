"""One rank of the FlexibleRunner check (tests/engine/test_flexible_runner.py), started by torch.distributed.run:
the toy model under mmengine's FlexibleRunner with a DDP or an FSDP strategy (mmwf's ResumableFSDPStrategy, whole
checkpoints written by rank 0) on gloo and the hooks of mmwf's configs. It trains and saves, then meets the bad
inputs whose errors the Runner gives too, and resumes; each rank writes what it saw."""
import json
import os
import sys

import torch.distributed as dist
from mmengine.runner import FlexibleRunner

import mmwf  # noqa: F401  (registers the hooks)
from tests.toy import ToyModel, make_runner

STRATEGIES = {  # as mmwf.utils.init_cpu_distributed adapts a config's strategy to the CPU
    'DDPStrategy': dict(type='DDPStrategy', model_wrapper=dict(device_ids=None, broadcast_buffers=False)),
    'ResumableFSDPStrategy': dict(type='ResumableFSDPStrategy', state_dict_cfg='full',
                                  model_wrapper=dict(device_id='cpu', use_orig_params=True))}


def flexible(strategy, work_dir, max_iters, **kwargs):
    return make_runner(work_dir, max_iters, FlexibleRunner, strategy=STRATEGIES[strategy], launcher='pytorch',
                       env_cfg=dict(dist_cfg=dict(backend='gloo')), **kwargs)


def outcome(run) -> str:
    try:
        run()
    except Exception as err:  # what the user sees
        return f'{type(err).__name__}: {err}'
    return 'ok'


def main(out: str, strategy: str) -> None:
    dist.init_process_group('gloo')  # as mmwf's tools start it without CUDA (mmengine's own start needs a GPU)
    work = os.path.join(out, 'run')
    seen = {'train': outcome(flexible(strategy, work, 3).train)}
    checkpoint = os.path.join(work, 'iter_3.pth')
    seen['other model'] = outcome(flexible(strategy, os.path.join(out, 'other'), 4, model=ToyModel(3),
                                           load_from=checkpoint).train)
    seen['other optimizer layout'] = outcome(flexible(
        strategy, os.path.join(out, 'layout'), 4, load_from=checkpoint, resume=True,
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.01), paramwise_cfg=dict(bias_lr_mult=2.0))).train)
    resumed = flexible(strategy, os.path.join(out, 'resumed'), 4, load_from=checkpoint, resume=True)
    seen['resume'] = outcome(resumed.train)
    seen['resumed iter'] = resumed.iter
    with open(os.path.join(out, f'rank{dist.get_rank()}.json'), 'w') as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
