# DiT-B/4, the baseline of Table 7 (DiT's models.py; the paper's row is DiT's published FID).
_base_ = './_base_/latent_diffusion_in256.py'

model = dict(denoiser=dict(type='DiT', arch='B', patch_size=4))
