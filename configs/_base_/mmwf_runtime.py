# What every mmwf config runs with, under any mmengine runner (Runner, FlexibleRunner) and the tools of mmwf,
# mmdet, mmseg and mmpretrain alike: mmwf's modules, and its checks as hooks (a base config adds them to its
# default_hooks with **_base_.mmwf_hooks). StrictLoadHook: load_from / test / resume stop on a checkpoint that does
# not fit (partial_load=True opts out). SafeCheckpointHook: checkpoints load weights-only, record their run and are
# written atomically. DatasetCheckHook: datasets checked against each other and the heads before the first batch.
# OptimizerStepSchedulerHook: iteration schedules count optimizer steps (gradient accumulation keeps the schedule).
custom_imports = dict(imports=['mmwf'], allow_failed_imports=False)
mmwf_hooks = dict(strict_load=dict(type='StrictLoadHook'), safe_checkpoint=dict(type='SafeCheckpointHook'),
                  dataset_check=dict(type='DatasetCheckHook'),
                  param_scheduler=dict(type='OptimizerStepSchedulerHook'))
