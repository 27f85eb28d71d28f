"""Checkpoints: reading (weights-only, errors naming the file), writing (atomic, plain data), strict loading."""
from .errors import CheckpointError, CheckpointMismatchError, UnsafeCheckpointError, diagnose
from .read import (
    checkpoint_problem,
    load_checkpoint_file,
    load_state_dict_file,
    load_weights_only,
    read_state_dict,
    safe_checkpoint_globals,
    safe_loading,
    unwrap_state_dict,
    whole_model_part,
)
from .strict import Mismatch, load_checked, load_strict, mismatch_lines, state_dict_mismatch
from .write import (
    ATOMIC_BACKEND,
    AtomicLocalBackend,
    atomic_save,
    atomic_write,
    output_problem,
    plain_checkpoint,
    register_atomic_backend,
    restore_checkpoint,
)

__all__ = ['CheckpointError', 'CheckpointMismatchError', 'UnsafeCheckpointError', 'diagnose', 'checkpoint_problem',
           'load_checkpoint_file', 'load_state_dict_file', 'load_weights_only',
           'read_state_dict', 'safe_checkpoint_globals', 'safe_loading', 'unwrap_state_dict', 'whole_model_part',
           'Mismatch',
           'load_checked', 'load_strict', 'mismatch_lines', 'state_dict_mismatch', 'ATOMIC_BACKEND', 'output_problem',
           'AtomicLocalBackend', 'atomic_save', 'atomic_write', 'plain_checkpoint', 'register_atomic_backend',
           'restore_checkpoint']
