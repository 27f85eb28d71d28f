"""The networks the analysis tools take by name or from a config: ImageNet classifiers (by their timm names) and
dense backbones, with random weights or a checkpoint."""
from __future__ import annotations

import copy
import os.path as osp

import torch.nn as nn

from mmwf.models.initializers import load_pretrained
from mmwf.models.layers.implementation import check_choice

# a classifier name's suffix -> the choices it sets on every layer of the network that holds them: '+triton', the
# Triton kernels (the depthwise convs, static ones included, and the factored dynamic linear), timed beside the rule's
KERNEL_VARIANTS = {'triton': dict(conv='triton', form='fused')}


def split_kernel_variant(name: str) -> tuple[str, dict[str, str]]:
    """(the classifier name, the layer choices of its :data:`KERNEL_VARIANTS` suffix, empty without one)."""
    base, plus, variant = name.partition('+')
    if plus and variant not in KERNEL_VARIANTS:
        raise ValueError(f'{name!r}: +{variant} is not a kernel variant; one of '
                         f'{", ".join("+" + v for v in KERNEL_VARIANTS)}')
    return base, KERNEL_VARIANTS[variant] if plus else {}


def with_kernels(model: nn.Module, name: str) -> nn.Module:
    """``model`` (built from ``name``'s config) with the choices of ``name``'s kernel variant set, for good, on
    every layer that holds them; a variant no layer of the network takes is refused."""
    _, choices = split_kernel_variant(name)
    held = [(m, key) for m in model.modules() for key in choices if key in getattr(m, 'choices', ())]
    if choices and not held:
        raise ValueError(f'{name!r}: no layer of this network takes the kernels of its variant')
    for module, key in held:
        setattr(module, key, check_choice(key, choices[key]))
    return model


def classifier_config(name: str) -> dict:
    """An ImageNet classifier by its name -> its backbone config with the 1000-class head. The names are mmwf's
    timm names, one per ImageNet config (``configs/imagenet/<name, _ as ->_in1k.py``): ``weightformer_{t,s,b}``,
    Table 2's ``weightformer_t_static`` and ``weightformer_t_dyn_*``, Table 6's ``weightformer_t_dynamic_{4,...,17}``,
    ``deit_{t,s,b}_{softmax,elu,relu,inline,mhla,ttt}``. A name may carry a :data:`KERNEL_VARIANTS` suffix
    (``weightformer_t+triton``): the config is the network's, and :func:`with_kernels` sets the kernels on the
    built model."""
    from mmwf.models.backbones import deit_study, weightformer
    base, _ = split_kernel_variant(name)
    for family, variants in (('WeightFormer', weightformer.TIMM_VARIANTS), ('DeiT', deit_study.TIMM_VARIANTS)):
        if base in variants:
            return dict(type=family, num_classes=1000, **copy.deepcopy(variants[base]))
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
    classifier_config(name)  # the name checked, with the list of names
    return with_kernels(timm.create_model(split_kernel_variant(name)[0], **timm_args), name).eval()


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
