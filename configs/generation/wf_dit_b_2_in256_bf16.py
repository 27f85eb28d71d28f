# WF-DiT-B/2 (Table 7) trained under bf16 autocast (fast-DiT's mixed precision; the paper trains in fp32): weights, AdamW
# states and the loss stay fp32, sampling for FID too. Without CUDA it trains in fp32 (logged).
_base_ = './wf_dit_b_2_in256.py'

optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16')
