"""FSDP under mmengine's ``FlexibleRunner`` that resumes what it saved.

Two faults of mmengine 0.10's ``FSDPStrategy`` on current torch, found on 2 gloo processes
(``tests/engine/test_flexible_runner.py``):

- it resumes the optimizer with torch 2.0's argument order of ``FSDP.optim_state_dict_to_load`` (state dict, model,
  optimizer); torch 2.1 and later take (model, optimizer, state dict), so a resumed run stops with
  ``TypeError: unhashable type: 'dict'``;
- its ``'full'`` state dicts offload to the CPU; with the parameters already there, torch's FSDP hands back each
  gathered optimizer state in one reused buffer, so a checkpoint holds AdamW's ``exp_avg_sq`` as ``exp_avg`` too and
  a resumed run silently departs from an uninterrupted one. Without CUDA the states are gathered without the
  offload (nothing to move).

:class:`ResumableFSDPStrategy` is that strategy with both mended, under a name of its own (mmengine's stays as it is).
"""
from __future__ import annotations

import dataclasses

import torch
from mmengine._strategy import FSDPStrategy

from mmwf.registry import STRATEGIES


@STRATEGIES.register_module()
class ResumableFSDPStrategy(FSDPStrategy):
    """mmengine's ``FSDPStrategy`` (same arguments) whose checkpoints resume exactly: the saved optimizer state
    loaded through ``FSDP.optim_state_dict_to_load(model, optimizer, state_dict)``, and on the CPU gathered without
    the offload that aliases it (module docstring)."""

    def _init_state_dict_cfg(self, state_dict_cfg: str | dict) -> None:
        super()._init_state_dict_cfg(state_dict_cfg)
        if not torch.cuda.is_available():
            for name in ('state_dict_config', 'optim_state_dict_config'):
                config = getattr(self, name)
                if getattr(config, 'offload_to_cpu', False):
                    setattr(self, name, dataclasses.replace(config, offload_to_cpu=False))

    def load_optim_state_dict(self, state_dict: dict) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        self.optim_wrapper.load_state_dict(
            FSDP.optim_state_dict_to_load(self.model, self.optim_wrapper.optimizer, state_dict))
