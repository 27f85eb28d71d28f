# WF-DiT-B/4 (Table 7): the release's model/wfm_dit.py, 15 blocks, dynamic blocks 1, 4, 7, 10, 13.
_base_ = './_base_/latent_diffusion_in256.py'

model = dict(denoiser=dict(type='WeightFormerDiT', arch='B', patch_size=4))
