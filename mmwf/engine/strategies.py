"""FSDP under mmengine's ``FlexibleRunner`` on current torch.

mmengine 0.10's ``FSDPStrategy`` resumes the optimizer with torch 2.0's argument order of
``FSDP.optim_state_dict_to_load`` (state dict, model, optimizer); torch 2.1 and later take (model, optimizer, state
dict), so a resumed FSDP run stops with ``TypeError: unhashable type: 'dict'``. :class:`ResumableFSDPStrategy` is
that strategy with the current call, under a name of its own (mmengine's stays as it is).
"""
from __future__ import annotations

from mmengine._strategy import FSDPStrategy

from mmwf.registry import STRATEGIES


@STRATEGIES.register_module()
class ResumableFSDPStrategy(FSDPStrategy):
    """mmengine's ``FSDPStrategy`` (same arguments) whose resume loads the saved optimizer state through
    ``FSDP.optim_state_dict_to_load(model, optimizer, state_dict)``."""

    def load_optim_state_dict(self, state_dict: dict) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        self.optim_wrapper.load_state_dict(
            FSDP.optim_state_dict_to_load(self.model, self.optim_wrapper.optimizer, state_dict))
