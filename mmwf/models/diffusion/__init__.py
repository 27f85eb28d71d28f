"""Class-conditional diffusion (the WeightFormer paper's section 5.4, Table 7): DiT and WeightFormer-DiT, DiT's
Gaussian diffusion, the frozen VAE and the mmengine model that trains and samples them."""
from .dit import DiT
from .dit_utils import DiffusionTransformer, sincos_pos_embed_2d, timestep_embedding
from .gaussian_diffusion import GaussianDiffusion, index_generators, space_timesteps
from .latent_diffusion import GenerationDataPreprocessor, LatentDiffusion
from .vae import LATENT_SCALE, FrozenVAE, load_vae
from .wf_dit import WeightFormerDiT

__all__ = ['DiffusionTransformer', 'DiT', 'WeightFormerDiT', 'sincos_pos_embed_2d', 'timestep_embedding',
           'GaussianDiffusion', 'index_generators', 'space_timesteps', 'GenerationDataPreprocessor', 'LatentDiffusion',
           'LATENT_SCALE', 'FrozenVAE', 'load_vae']
