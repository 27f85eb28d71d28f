"""The networks the analysis tools take by name or from a config: ImageNet classifiers (Table 3's names) and dense
backbones, with random weights or a checkpoint."""
from __future__ import annotations

import os.path as osp

import torch
import torch.nn as nn

from mmwf.models.initializers import load_pretrained

# classifier names -> the ImageNet configs whose metafile entries hold the paper's counts (Table 3)
CLASSIFIER_CONFIGS = {'wf-t': 'weightformer_t_in1k', 'wf-s': 'weightformer_s_in1k', 'deit-t': 'deit_t_softmax_in1k',
                      'deit-s': 'deit_s_softmax_in1k', 'deit-b': 'deit_b_softmax_in1k'}


def classifier_config(name: str) -> dict:
    """An ImageNet classifier by name -> its backbone config with the 1000-class head: ``wf-{t,s,b}``,
    ``static-t`` (WF-T with every block static), ``deit-{t,s,b}`` and ``deit-{t,s,b}-{elu,relu,inline,mhla,ttt}``."""
    parts = name.split('-')
    family, arch, op = parts[0], parts[1] if len(parts) > 1 else '', parts[2:]
    from mmwf.models.layers import OPERATORS
    linear = [n for n in OPERATORS if n != 'softmax']  # softmax is plain deit-t
    if family not in ('wf', 'static', 'deit') or arch not in ('t', 's', 'b') or len(op) > 1 or (
            op and (family != 'deit' or op[0] not in linear)):
        raise ValueError(f'{name!r} is not a classifier name (wf-t, static-t, deit-s, deit-b-relu, ...; '
                         f'operators: {", ".join(linear)})')
    if family != 'deit':
        return dict(type='WeightFormer', arch=arch, num_classes=1000,
                    **({'dynamic_blocks': []} if family == 'static' else {}))
    attn = OPERATORS[op[0] if op else 'softmax']
    return dict(type='DeiT', arch=arch, num_classes=1000, attn_cfg=dict(type=attn.__name__))


class Classifier(nn.Module):
    """A backbone's ImageNet classifier path (``forward_classifier``) as a module: images -> logits."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone.forward_classifier(x)


def build_classifier(name: str, **timm_args) -> Classifier:
    """:func:`classifier_config` built, or one of mmwf's timm models (``weightformer_t``, ``deit_t_relu``, ...)
    created with ``timm_args`` (e.g. ``norm_layer='rmsnorm'``, ``mlp_layer='swiglu'``); random weights, eval
    mode."""
    from mmwf.models.backbones import deit_study, weightformer
    if name in weightformer.TIMM_VARIANTS or name in deit_study.TIMM_VARIANTS:
        import timm
        return Classifier(timm.create_model(name, **timm_args)).eval()
    if timm_args:
        raise ValueError(f'model arguments {sorted(timm_args)} are for mmwf\'s timm names (weightformer_t, '
                         f'deit_t_relu, ...), not for {name!r}')
    from mmwf.registry import MODELS
    return Classifier(MODELS.build(classifier_config(name))).eval()


def backbone_config(spec: str) -> dict:
    """A dense backbone config (no head; DeiT without class token) from a name of :func:`classifier_config`
    (``wf-t``, ``static-t``, ``deit-s``, ``deit-t-ttt``, ...) or from an mmdet / mmseg config file (its
    ``model.backbone``, or ``model.student.backbone`` under AttentionDistiller)."""
    if not osp.isfile(spec):
        try:
            cfg = classifier_config(spec)
        except ValueError:
            raise FileNotFoundError(f'{spec!r} is neither a backbone name (wf-t, wf-s, wf-b, static-t, deit-t, '
                                    'deit-s, deit-t-relu, ...) nor a config file') from None
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
