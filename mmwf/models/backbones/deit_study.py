"""The DeiTs of the linear-attention study as timm models: ``deit_{t,s,b}_{softmax,elu,relu,inline,mhla,ttt}``
(:data:`TIMM_VARIANTS`), named after their configs (``configs/imagenet/deit_<size>_<operator>_in1k.py``). Their own
module, so that timm files them under ``deit_study``, not under timm's own ``deit``."""
from __future__ import annotations

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import generate_default_cfgs

from mmwf.models.frontends import register_timm_models
from mmwf.models.layers import OPERATORS

from .deit import DeiT

__all__ = ['TIMM_VARIANTS']  # and the timm entry points registered below


def _cfg(**kwargs) -> dict:
    """A DeiT ``pretrained_cfg``: evaluated as the study's configs evaluate (bicubic square resize to 256 / 224 of
    the input, centre crop, ImageNet mean and std); any input size (the position table is resampled)."""
    return dict(num_classes=1000, input_size=(3, 224, 224), crop_pct=0.875, crop_mode='squash',
                interpolation='bicubic', mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
                first_conv='patch_embed.proj', classifier='head', **kwargs)


# the softmax ones load the official DeiT weights (timm's hub copies; timm's own names for them are
# deit_{tiny,small,base}_patch16_224)
TIMM_VARIANTS = {f'deit_{size}_{op}': dict(arch=size, attn_cfg=dict(type=cls.__name__))
                 for size in DeiT.ARCH_SETTINGS for op, cls in OPERATORS.items()}
_OFFICIAL = dict(t='tiny', s='small', b='base')

default_cfgs = generate_default_cfgs({
    **{f'deit_{size}_softmax.fb_in1k': _cfg(hf_hub_id=f'timm/deit_{name}_patch16_224.fb_in1k', license='apache-2.0')
       for size, name in _OFFICIAL.items()},
    **{name: _cfg() for name in TIMM_VARIANTS if not name.endswith('_softmax')},
})


register_timm_models(DeiT, TIMM_VARIANTS, globals())
