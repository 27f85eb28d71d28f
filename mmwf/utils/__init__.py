from . import stack
from .checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    UnsafeCheckpointError,
    load_state_dict_file,
    load_strict,
    load_weights_only,
    read_state_dict,
    safe_checkpoint_globals,
    safe_loading,
    unwrap_state_dict,
)
from .runtime import adapt_to_device, close_distributed, init_cpu_distributed, init_tool_distributed, launched_device
from .stack import StackError, check_stack, stack_problems

__all__ = ['CheckpointError', 'CheckpointMismatchError', 'UnsafeCheckpointError', 'adapt_to_device',
           'close_distributed', 'init_cpu_distributed', 'init_tool_distributed', 'launched_device', 'stack',
           'check_stack', 'stack_problems', 'StackError', 'load_state_dict_file',
           'load_strict', 'load_weights_only', 'read_state_dict', 'safe_checkpoint_globals', 'safe_loading',
           'unwrap_state_dict']
