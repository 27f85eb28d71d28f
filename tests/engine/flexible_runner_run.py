"""One rank of the FlexibleRunner check (tests/engine/test_flexible_runner.py), started by torch.distributed.run:
the toy model under mmengine's FlexibleRunner with a DDP or an FSDP strategy (mmwf's ResumableFSDPStrategy, whole
checkpoints written by rank 0) on gloo, with the hooks of mmwf's configs and an EMA (FlexibleEMAHook). It trains
and saves, meets the bad inputs whose errors the Runner gives too, and resumes; as the reference, mmengine's Runner
with DDP and mmengine's own EMAHook trains the same model on the same data. Each rank writes what it saw, rank 0
the weights and EMA weights of the last checkpoints."""
import json
import os
import sys

import torch
import torch.distributed as dist
from mmengine.runner import FlexibleRunner, Runner

import mmwf  # noqa: F401  (registers the hooks)
from tests.toy import ToyModel, make_runner

STRATEGIES = {  # as mmwf.utils.init_cpu_distributed adapts a config's strategy to the CPU
    'DDPStrategy': dict(type='DDPStrategy', model_wrapper=dict(device_ids=None, broadcast_buffers=False)),
    'ResumableFSDPStrategy': dict(type='ResumableFSDPStrategy', state_dict_cfg='full',
                                  model_wrapper=dict(device_id='cpu', use_orig_params=True))}


DISTRIBUTED = dict(launcher='pytorch', env_cfg=dict(dist_cfg=dict(backend='gloo')))


def seeded_model(out_features: int = 1) -> ToyModel:
    torch.manual_seed(0)
    return ToyModel(out_features)


def flexible(strategy, work_dir, max_iters, **kwargs):
    kwargs.setdefault('model', seeded_model())
    return make_runner(work_dir, max_iters, FlexibleRunner, strategy=STRATEGIES[strategy],
                       custom_hooks=[dict(type='FlexibleEMAHook', momentum=0.5)], **DISTRIBUTED, **kwargs)


def weights(path: str) -> dict[str, list[float]]:
    """The weights (the EMA's, as mmengine's EMAHook saves them) and the EMA entry (the model's own) of a
    checkpoint, flat, under their names without a wrapper's prefix."""
    checkpoint = torch.load(path, weights_only=True)
    return {f'{part} {k.removeprefix("module.")}': v.flatten().tolist() for part in ('state_dict', 'ema_state_dict')
            for k, v in checkpoint[part].items() if k != 'steps'}


def outcome(run) -> str:
    try:
        run()
    except Exception as err:  # what the user sees
        return f'{type(err).__name__}: {err}'
    return 'ok'


def main(out: str, strategy: str) -> None:
    dist.init_process_group('gloo')  # as mmwf's tools start it without CUDA (mmengine's own start needs a GPU)
    reference = os.path.join(out, 'reference')
    make_runner(reference, 4, Runner, model=seeded_model(), custom_hooks=[dict(type='EMAHook', momentum=0.5)],
                cfg=dict(model_wrapper_cfg=dict(type='MMDistributedDataParallel', device_ids=None)),
                **DISTRIBUTED).train()
    work = os.path.join(out, 'run')
    seen = {'train': outcome(flexible(strategy, work, 4).train)}
    checkpoint = os.path.join(work, 'iter_3.pth')
    seen['other model'] = outcome(flexible(strategy, os.path.join(out, 'other'), 4, model=seeded_model(3),
                                           load_from=checkpoint).train)
    seen['other optimizer layout'] = outcome(flexible(
        strategy, os.path.join(out, 'layout'), 4, load_from=checkpoint, resume=True,
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=0.01), paramwise_cfg=dict(bias_lr_mult=2.0))).train)
    resumed = flexible(strategy, os.path.join(out, 'resumed'), 4, load_from=checkpoint, resume=True)
    seen['resume'] = outcome(resumed.train)
    seen['resumed iter'] = resumed.iter
    if dist.get_rank() == 0:
        seen['weights'] = {run: weights(os.path.join(out, run, 'iter_4.pth'))
                           for run in ('reference', 'run', 'resumed')}
    with open(os.path.join(out, f'rank{dist.get_rank()}.json'), 'w') as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
