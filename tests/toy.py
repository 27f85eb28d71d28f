"""A toy mmengine model, dataset and runner: resume, strict loading and checkpoint writing in seconds."""
import uuid
from pathlib import Path

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.runner import Runner

# the hooks every mmwf config runs with, as the configs state them
MMWF_HOOKS = Config.fromfile(str(Path(__file__).resolve().parents[1] / 'configs/_base_/mmwf_runtime.py')).mmwf_hooks


class ToyModel(BaseModel):
    def __init__(self, out_features: int = 1):
        super().__init__()
        self.linear = nn.Linear(4, out_features)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.linear(inputs)
        if mode == 'loss':
            return dict(loss=((out - data_samples) ** 2).mean())
        return out


class ToyData(torch.utils.data.Dataset):
    metainfo = dict(classes=('sum',))

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(32, 4, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return dict(inputs=self.x[i], data_samples=self.y[i])


def make_runner(work_dir, max_iters, runner_cls=Runner, model=None, interval=3, mmwf_hooks=True, hooks=None,
                **kwargs):
    """A runner of ``max_iters`` on the toy data, checkpointing every ``interval``, with the hooks of mmwf's configs
    (unless ``mmwf_hooks=False``) and ``hooks`` (more default hooks); its own logger (log file in
    ``work_dir/<experiment>/``)."""
    return runner_cls(
        model=model or ToyModel(), work_dir=str(work_dir),
        train_dataloader=dict(dataset=ToyData(), sampler=dict(type='DefaultSampler', shuffle=True),
                              batch_size=4, num_workers=0, collate_fn=dict(type='default_collate')),
        default_hooks={'checkpoint': dict(type='CheckpointHook', interval=interval, by_epoch=False),
                       'logger': dict(type='LoggerHook', interval=1), **(MMWF_HOOKS if mmwf_hooks else {}),
                       **(hooks or {})},
        default_scope='mmengine', experiment_name=f'toy_{uuid.uuid4().hex[:8]}',
        **{'optim_wrapper': dict(optimizer=dict(type='AdamW', lr=0.01)), 'randomness': dict(seed=0),
           'train_cfg': dict(by_epoch=False, max_iters=max_iters), **kwargs})



class ToyMetric(BaseMetric):
    """A validation metric of the toy model, ``score`` = -MSE (higher is better), for best checkpoints."""

    def process(self, data_batch, data_samples):
        out = torch.stack(list(data_samples))
        self.results.append(((out - data_batch['data_samples']) ** 2).mean().item())

    def compute_metrics(self, results):
        return dict(score=-sum(results) / len(results))
