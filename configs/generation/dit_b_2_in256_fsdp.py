# DiT-B/2 (Table 7) under mmengine's FlexibleRunner with FSDP: parameters, gradients and AdamW states sharded over the
# GPUs, whole checkpoints written by rank 0 (loadable by Runner and the tools), the EMA kept whole on every GPU
# (FlexibleEMAHook). The row's recipe otherwise; for a GPU the row's per-GPU batch does not fit.
_base_ = './dit_b_2_in256.py'

runner_type = 'FlexibleRunner'
strategy = dict(type='ResumableFSDPStrategy', state_dict_cfg='full', model_wrapper=dict(use_orig_params=True))
