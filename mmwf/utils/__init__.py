from . import stack
from .checkpoint import (
                         CheckpointError,
                         UnsafeCheckpointError,
                         enable_safe_mmengine_checkpoints,
                         load_state_dict_file,
                         load_weights_only,
                         safe_checkpoint_globals,
)
from .setup_env import (
                         adapt_to_device,
                         add_runner_args,
                         build_runner,
                         check_dataset_paths,
                         init_cpu_distributed,
                         load_tool_config,
)
from .stack import StackError, check_stack, stack_problems

__all__ = ['CheckpointError', 'UnsafeCheckpointError', 'add_runner_args', 'build_runner', 'adapt_to_device',
           'check_dataset_paths', 'init_cpu_distributed', 'load_tool_config', 'stack', 'check_stack', 'stack_problems',
           'StackError', 'enable_safe_mmengine_checkpoints', 'load_state_dict_file', 'load_weights_only',
           'safe_checkpoint_globals']
