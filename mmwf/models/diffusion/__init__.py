"""Class-conditional diffusion (the WeightFormer paper's section 5.4, Table 7): DiT and WeightFormer-DiT, DiT's
Gaussian diffusion, the frozen VAE and the mmengine model that trains and samples them.

:mod:`~mmwf.models.diffusion.diffusers_model` (the denoisers as a diffusers model) imports diffusers' model classes,
which ``import mmwf`` does not pay for: it is registered as a lazy module (``importlib.util.LazyLoader``), run on
first use. Saved diffusers pipelines name it in ``model_index.json`` and diffusers resolves only modules already
imported, so ``import mmwf`` is all that loading one needs."""
import importlib.util
import sys
from types import ModuleType

from .dit import DiT
from .dit_utils import DiffusionTransformer, sincos_pos_embed_2d, timestep_embedding
from .gaussian_diffusion import GaussianDiffusion, index_generators, space_timesteps
from .latent_diffusion import GenerationDataPreprocessor, LatentDiffusion
from .vae import LATENT_SCALE, FrozenVAE, load_vae
from .wf_dit import WeightFormerDiT


def _import_lazily(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


diffusers_model = _import_lazily(f'{__name__}.diffusers_model')

__all__ = ['DiffusionTransformer', 'DiT', 'WeightFormerDiT', 'sincos_pos_embed_2d', 'timestep_embedding',
           'GaussianDiffusion', 'index_generators', 'space_timesteps', 'GenerationDataPreprocessor', 'LatentDiffusion',
           'LATENT_SCALE', 'FrozenVAE', 'load_vae']
