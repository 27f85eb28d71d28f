"""Stop training at the first non-finite loss, naming the iteration and the loss terms."""
from __future__ import annotations

import math

import torch
from mmengine.hooks import Hook

from mmwf.registry import HOOKS


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """After every training iteration, raise ``FloatingPointError`` when the total loss or any logged loss term is
    NaN or infinite, before a checkpoint is written (this hook runs at NORMAL priority, the checkpoint hook at
    VERY_LOW). mmdet's ``CheckInvalidLossHook`` checks the total every 50 iterations and names no term.

    Usage: ``custom_hooks = [dict(type='NonFiniteLossHook')]``.
    """

    def after_train_iter(self, runner, batch_idx: int, data_batch: dict | None = None,
                         outputs: dict | None = None) -> None:
        values = {name: float(value.detach() if isinstance(value, torch.Tensor) else value)
                  for name, value in (outputs or {}).items() if 'loss' in name}
        bad = {name: value for name, value in values.items() if not math.isfinite(value)}
        if bad:
            terms = ', '.join(f'{name}={value}' for name, value in bad.items())
            finite = ', '.join(f'{name}={value:.4g}' for name, value in values.items() if name not in bad)
            raise FloatingPointError(
                f'training stopped at iteration {runner.iter + 1}: non-finite loss ({terms}; finite terms: '
                f'{finite or "none"}). Lower the learning rate or add optim_wrapper.clip_grad, check the data of '
                'this batch (degenerate boxes, empty masks), or train in fp32 (optim_wrapper.type=OptimWrapper); '
                f'then resume from the last checkpoint in {runner.work_dir} with --resume.')
