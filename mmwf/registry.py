"""Registries used by mmwf.

mmwf registers into mmengine's *root* registries. Every MMLab project (mmdet, mmseg, mmpretrain, ...)
builds its registries as children of these, and a child looks a name up in its parents when it does not
hold it itself, so ``custom_imports = dict(imports=['mmwf'])`` makes our modules usable under any
project's own ``default_scope`` without importing that project here.
"""
from mmengine.registry import (
                               DATASETS,
                               HOOKS,
                               METRICS,
                               MODELS,
                               OPTIM_WRAPPER_CONSTRUCTORS,
                               RUNNERS,
                               STRATEGIES,
                               TRANSFORMS,
                               WEIGHT_INITIALIZERS,
)

__all__ = ['DATASETS', 'METRICS', 'MODELS', 'HOOKS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'RUNNERS', 'STRATEGIES',
           'TRANSFORMS', 'WEIGHT_INITIALIZERS']
