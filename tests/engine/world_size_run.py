"""One rank of the several-process check (tests/engine/test_world.py; tools/cuda_check.sh on two GPUs), started by
torch.distributed.run: for each config family, the toy model trained for two iterations under DDP (on gloo, or on
NCCL with a GPU per process) with the family's WorldSizeHook and TF32Hook as its config states them; each rank
writes its first draws after the hooks, its TF32 flag during the run, and its parameters at the end."""
import json
import os
import sys

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.hooks import Hook

import mmwf  # noqa: F401  (registers the hooks)
from mmwf.utils.tf32_settings import matmul_tf32
from tests.toy import make_runner


class Probe(Hook):
    priority = 'LOWEST'  # after WorldSizeHook

    def before_train(self, runner):
        self.seed = torch.initial_seed()
        self.draws = torch.rand(3).tolist()
        self.tf32 = matmul_tf32()


def main(out: str, configs: list[str]) -> None:
    local_rank = int(os.environ.get('LOCAL_RANK', 0))
    nccl = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get('LOCAL_WORLD_SIZE', 1))
    if nccl:
        torch.cuda.set_device(local_rank)
    backend = 'nccl' if nccl else 'gloo'
    dist.init_process_group(backend)
    seen = {}
    for config in configs:
        cfg = Config.fromfile(config)
        probe = Probe()
        hooks = {k: cfg.default_hooks[k] for k in ('world_size', 'tf32')}
        runner = make_runner(os.path.join(out, os.path.basename(config)), 2, interval=2, hooks=hooks,
                             custom_hooks=[probe], randomness=dict(seed=5), launcher='pytorch',
                             env_cfg=dict(dist_cfg=dict(backend=backend)), auto_scale_lr=cfg.auto_scale_lr,
                             cfg=dict(model_wrapper_cfg=dict(type='MMDistributedDataParallel',
                                                             device_ids=[local_rank] if nccl else None)))
        runner.train()
        params = [p.detach().cpu().flatten().tolist() for p in runner.model.module.parameters()]
        seen[config] = dict(backend=backend, seed=probe.seed, draws=probe.draws, tf32=probe.tf32, params=params,
                            tf32_after=matmul_tf32())
    with open(os.path.join(out, f'rank{dist.get_rank()}.json'), 'w') as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2:])
