"""Backbones and images for the analysis tools (erf.py, dynamic_strength.py)."""
from __future__ import annotations

import glob
import os.path as osp

import torch
import torch.nn as nn

from mmwf.utils.checkpoint import load_pretrained

DEMO_ROOT = osp.join('data', 'demo')  # where tools/generate_demo_data.py writes, relative to the working directory



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


def build_classifier(name: str) -> Classifier:
    """:func:`classifier_config` built, random weights, eval mode."""
    from mmwf.registry import MODELS
    return Classifier(MODELS.build(classifier_config(name))).eval()


def task_model_config(config: str):
    """An mmdet / mmseg / mmpretrain config file adapted to this device (:func:`mmwf.utils.adapt_to_device`) and the
    config of the network it tests, with random backbone weights (``init_cfg`` dropped): ``model``, or its
    ``student`` under AttentionDistiller (the teacher is training-only). Returns ``(cfg, model_cfg)``."""
    from mmengine.config import Config

    from mmwf.utils import adapt_to_device
    cfg = Config.fromfile(config)
    adapt_to_device(cfg)
    model_cfg = cfg.model.get('student', cfg.model)
    model_cfg.backbone.pop('init_cfg', None)
    return cfg, model_cfg


def build_task_model(scope: str, model_cfg) -> nn.Module:
    """``model_cfg`` built by the registry of ``scope`` (``'mmdet'``, ``'mmseg'``), that scope made the default."""
    from importlib import import_module

    from mmengine.registry import init_default_scope
    init_default_scope(scope)
    return import_module(f'{scope}.registry').MODELS.build(model_cfg)


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


def load_images(folder: str | None, size: int, limit: int) -> torch.Tensor:
    """Up to ``limit`` images of ``folder`` (default: the demo images under ./data/demo, generated if absent),
    resized to ``size`` x ``size``, normalised with ImageNet's mean and std: (B, 3, size, size)."""
    import cv2
    import numpy as np
    if folder is None:
        folder = osp.join(DEMO_ROOT, 'coco', 'val')
        if not glob.glob(osp.join(folder, '*.jpg')):
            from mmwf.datasets import generate
            generate(DEMO_ROOT)
    files = sorted(f for ext in ('jpg', 'jpeg', 'png') for f in glob.glob(osp.join(folder, f'*.{ext}')))[:limit]
    if not files:
        raise FileNotFoundError(f'no .jpg / .png images in {folder!r}; give --images a folder of images, or leave it '
                                'out to use the demo images (python tools/generate_demo_data.py)')
    mean, std = np.array([123.675, 116.28, 103.53]), np.array([58.395, 57.12, 57.375])
    images = [(cv2.resize(cv2.imread(f)[:, :, ::-1], (size, size), interpolation=cv2.INTER_LINEAR) - mean) / std
              for f in files]
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float()
