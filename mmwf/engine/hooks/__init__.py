from .compile import CompileHook
from .dataset_check import DatasetCheckHook
from .ema import FlexibleEMAHook
from .non_finite_loss import NonFiniteLossHook
from .optimizer_step_scheduler import OptimizerStepSchedulerHook
from .safe_checkpoint import SafeCheckpointHook
from .show_predictions import ShowPredictionsHook
from .strict_load import StrictLoadHook
from .tf32 import TF32Hook
from .world_size import WorldSizeHook

__all__ = ['CompileHook', 'DatasetCheckHook', 'FlexibleEMAHook', 'NonFiniteLossHook', 'OptimizerStepSchedulerHook',
           'SafeCheckpointHook',
           'ShowPredictionsHook', 'StrictLoadHook', 'TF32Hook', 'WorldSizeHook']
