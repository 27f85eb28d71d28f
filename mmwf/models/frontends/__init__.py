"""How mmwf's backbones are reached from other libraries: the Hugging Face hub (:mod:`.hub`, the mixin every backbone
inherits) and timm (:mod:`.timm`, the registered names). diffusers' model is
:mod:`mmwf.models.diffusion.diffusers_model` (the module saved pipelines name; ``import mmwf`` registers it lazily)
and mmpretrain's model hub :mod:`mmwf.model_hub` (imported on demand: it imports mmpretrain)."""
from .hub import HubModel
from .timm import create_timm_model, register_timm_models, timm_checkpoint_filter

__all__ = ['HubModel', 'create_timm_model', 'register_timm_models', 'timm_checkpoint_filter']
