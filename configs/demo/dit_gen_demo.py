# The DiT baseline of wf_dit_gen_demo.py, trained the same way: DiT blocks (softmax attention, 4 heads) at the same
# width 128 and patch 2, depth 4 against WF-DiT's 5 (the paper's 12 against 15).
_base_ = './wf_dit_gen_demo.py'

model = dict(denoiser=dict(type='DiT', arch=dict(_delete_=True, hidden_size=128, depth=4, num_heads=4)))
