"""The networks the analysis tools take by name or from a config: ImageNet classifiers (by their timm names) and
dense backbones, with random weights or a checkpoint."""
from __future__ import annotations

import copy
import inspect
import os.path as osp

import torch.nn as nn

from mmwf.models.initializers import load_pretrained

# a classifier name's suffix -> the choices it sets on WeightFormer's dynamic layers: '+triton', the Triton kernels
# (the per-sample depthwise conv and the factored dynamic linear), timed beside the rule's picks
KERNEL_VARIANTS = {'triton': dict(dynamic_dwc=dict(conv='triton'), dynamic_linear=dict(form='fused'))}


def kernel_variant(cfg: dict, variant: str) -> dict:
    """The WeightFormer config ``cfg`` with its dynamic layers' choices set to :data:`KERNEL_VARIANTS`'s ``variant``
    (where a layer holds that choice)."""
    from mmwf.models.backbones import WeightFormer
    from mmwf.registry import MODELS
    if variant not in KERNEL_VARIANTS or cfg['type'] != 'WeightFormer':
        raise ValueError(f'+{variant} is not a kernel variant of {cfg["type"]}: WeightFormer\'s names take '
                         f'{", ".join("+" + v for v in KERNEL_VARIANTS)}')
    defaults = inspect.signature(WeightFormer).parameters
    if not cfg.get('dynamic_blocks', True):
        raise ValueError(f'+{variant}: this WeightFormer has no dynamic blocks, so no layer takes the kernels')
    cfg = dict(cfg)
    for key, choices in KERNEL_VARIANTS[variant].items():
        layer = cfg.get(key, defaults[key].default)
        if layer is not None:
            held = MODELS.get(layer['type']).choices
            cfg[key] = dict(layer, **{k: v for k, v in choices.items() if k in held})
    return cfg


def classifier_config(name: str) -> dict:
    """An ImageNet classifier by its name -> its backbone config with the 1000-class head. The names are mmwf's
    timm names, one per ImageNet config (``configs/imagenet/<name, _ as ->_in1k.py``): ``weightformer_{t,s,b}``,
    Table 2's ``weightformer_t_static`` and ``weightformer_t_dyn_*``, Table 6's ``weightformer_t_dynamic_{4,...,17}``,
    ``deit_{t,s,b}_{softmax,elu,relu,inline,mhla,ttt}``; a WeightFormer name with a :data:`KERNEL_VARIANTS` suffix
    (``weightformer_t+triton``) is that network with those kernels."""
    from mmwf.models.backbones import deit_study, weightformer
    base, plus, variant = name.partition('+')
    for family, variants in (('WeightFormer', weightformer.TIMM_VARIANTS), ('DeiT', deit_study.TIMM_VARIANTS)):
        if base in variants:
            cfg = dict(type=family, num_classes=1000, **copy.deepcopy(variants[base]))
            return kernel_variant(cfg, variant) if plus else cfg
    raise ValueError(f'{name!r} is not a classifier name: one of mmwf\'s timm names (weightformer_t, '
                     'weightformer_t_static, deit_t_softmax, deit_b_ttt, ...; timm.list_models("weightformer*") '
                     'and timm.list_models("deit_[tsb]_*") list them), optionally with a kernel variant '
                     f'({", ".join("+" + v for v in KERNEL_VARIANTS)})')


def imagenet_model_name(name: str) -> str:
    """The ImageNet config (its metafile entry) of classifier ``name``: ``weightformer_t_dyn_linear1`` ->
    ``weightformer_t_dyn-linear1_in1k``; ``name`` itself if it is not a classifier name."""
    from mmwf.configs import metafile_models
    return next((model for model in metafile_models()
                 if model.endswith('_in1k') and model.removesuffix('_in1k').replace('-', '_') == name), name)


def build_classifier(name: str, **timm_args) -> nn.Module:
    """The classifier ``name`` (:func:`classifier_config`) as timm creates it, images -> logits, with random
    weights in eval mode; ``timm_args`` are timm's model arguments (e.g. ``norm_layer='rmsnorm'``,
    ``mlp_layer='swiglu'``)."""
    import timm
    cfg = classifier_config(name)  # the name checked, with the list of names
    base, plus, variant = name.partition('+')
    layers = {key: cfg[key] for key in KERNEL_VARIANTS.get(variant, ()) if key in cfg} if plus else {}
    return timm.create_model(base, **layers, **timm_args).eval()


def backbone_config(spec: str) -> dict:
    """A dense backbone config (no head; DeiT without class token) from a name of :func:`classifier_config`
    (``weightformer_t``, ``deit_s_softmax``, ``deit_t_ttt``, ...) or from an mmdet / mmseg config file (its
    ``model.backbone``, or ``model.student.backbone`` under AttentionDistiller)."""
    if not osp.isfile(spec):
        try:
            cfg = classifier_config(spec)
        except ValueError:
            raise FileNotFoundError(f'{spec!r} is neither a backbone name (weightformer_t, weightformer_s, '
                                    'deit_t_softmax, deit_t_relu, ...) nor a config file') from None
        cfg.pop('num_classes')
        if cfg['type'] == 'DeiT':
            cfg['with_cls_token'] = False
        return cfg
    from mmengine.config import Config
    model = Config.fromfile(spec).model
    return dict(model.get('student', model).backbone)


def build_backbone(spec: str | dict, checkpoint: str | None = None) -> nn.Module:
    """Build a backbone with random weights (its ``init_cfg`` dropped) and, when given, load ``checkpoint``
    strictly (a backbone, classifier or detector / segmentor checkpoint: ``backbone.`` keys are unwrapped)."""
    from mmwf.registry import MODELS
    cfg = backbone_config(spec) if isinstance(spec, str) else dict(spec)
    cfg.pop('init_cfg', None)
    model = MODELS.build(cfg)
    if checkpoint:
        load_pretrained(model, checkpoint)
    return model.eval()
