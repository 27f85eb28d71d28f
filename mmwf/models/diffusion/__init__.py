"""Class-conditional diffusion (the WeightFormer paper's section 5.4, Table 7): DiT and WeightFormer-DiT, DiT's
Gaussian diffusion, the frozen VAE and the mmengine model that trains and samples them.

:mod:`~mmwf.models.diffusion.diffusers_model` (the denoisers as a diffusers model) imports diffusers' model classes,
which ``import mmwf`` does not pay for (diffusers is a requirement of generation only): it is registered by name and
run on the first use of one of its names. Saved diffusers pipelines name it in ``model_index.json`` and diffusers
resolves only modules already imported, so ``import mmwf`` is all that loading one needs."""
import importlib.util
import sys
import threading
from types import ModuleType

from .dit import DiT
from .dit_utils import DiffusionTransformer, sincos_pos_embed_2d, timestep_embedding
from .gaussian_diffusion import GaussianDiffusion, index_generators, space_timesteps
from .latent_diffusion import GenerationDataPreprocessor, LatentDiffusion
from .vae import LATENT_SCALE, FrozenVAE, load_vae
from .wf_dit import WeightFormerDiT


def _register_on_first_use(name: str) -> ModuleType:
    """``name`` in ``sys.modules`` as a stand-in with the module's spec and file, so that whoever scans the imported
    modules (mmengine's registries read every module's file) runs nothing; the first of its own names asked for runs
    the module in its place, and a failure (diffusers missing) leaves the stand-in to fail the same way again."""
    if name in sys.modules:
        return sys.modules[name]
    stand_in = importlib.util.module_from_spec(importlib.util.find_spec(name))

    def load(attr: str) -> object:
        if attr.startswith('__'):
            raise AttributeError(f'module {name!r} has no attribute {attr!r}')
        with _LOCK:
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
                try:
                    importlib.import_module(name)
                except BaseException:
                    sys.modules[name] = stand_in
                    raise
        return getattr(sys.modules[name], attr)

    stand_in.__getattr__ = load
    sys.modules[name] = stand_in
    return stand_in


_LOCK = threading.Lock()
diffusers_model = _register_on_first_use(f'{__name__}.diffusers_model')

__all__ = ['DiffusionTransformer', 'DiT', 'WeightFormerDiT', 'sincos_pos_embed_2d', 'timestep_embedding',
           'GaussianDiffusion', 'index_generators', 'space_timesteps', 'GenerationDataPreprocessor', 'LatentDiffusion',
           'LATENT_SCALE', 'FrozenVAE', 'load_vae']
