from . import stack
from .checkpoint import (
                         enable_safe_mmengine_checkpoints,
                         load_state_dict_file,
                         load_weights_only,
                         safe_checkpoint_globals,
)
from .stack import StackError, check_stack, stack_problems

__all__ = ['stack', 'check_stack', 'stack_problems', 'StackError', 'enable_safe_mmengine_checkpoints',
           'load_state_dict_file', 'load_weights_only', 'safe_checkpoint_globals']
