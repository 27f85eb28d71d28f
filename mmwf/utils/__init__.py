from . import stack
from .checkpoint import (
                         CheckpointError,
                         StrictPretrained,
                         UnsafeCheckpointError,
                         enable_safe_mmengine_checkpoints,
                         load_pretrained,
                         load_state_dict_file,
                         load_strict,
                         load_weights_only,
                         read_state_dict,
                         safe_checkpoint_globals,
                         unwrap_state_dict,
)
from .runtime import adapt_to_device, build_runner, check_dataset_paths, close_distributed, init_cpu_distributed
from .stack import StackError, check_stack, stack_problems

__all__ = ['CheckpointError', 'UnsafeCheckpointError', 'StrictPretrained', 'build_runner', 'adapt_to_device',
           'check_dataset_paths', 'close_distributed', 'init_cpu_distributed', 'stack', 'check_stack',
           'stack_problems', 'StackError',
           'enable_safe_mmengine_checkpoints', 'load_pretrained', 'load_state_dict_file', 'load_strict',
           'load_weights_only', 'read_state_dict', 'safe_checkpoint_globals', 'unwrap_state_dict']
