"""Layer-wise learning-rate decay for plain (non-hierarchical) backbones, as ViTDet and BEiT fine-tune."""
from __future__ import annotations

import re

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor

from mmwf.registry import OPTIM_WRAPPER_CONSTRUCTORS

NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Per-parameter lr = base_lr * decay_rate ** (num_layers + 1 - layer_id); no weight decay on norms and
    position embeddings.

    Layer ids: 0 for the backbone stem (``patch_embed``, ``init_norm``, ``pos_embed``, ``cls_token``),
    i + 1 for ``backbone.blocks.{i}``, num_layers + 1 for everything else (the backbone's final norm, the
    neck and the heads); a ``student.`` prefix (``AttentionDistiller``) is ignored. ``paramwise_cfg``:

    - ``num_layers``: blocks of the backbone (WeightFormer 17, DeiT 12).
    - ``decay_rate``: e.g. 0.7 (ViTDet detection), 0.92 (UperNet segmentation).
    - ``no_decay_names``: parameter-name fragments without weight decay, besides norms
      (default ``('pos_embed', 'cls_token')``).

    Usage (any MMLab project, after ``custom_imports = dict(imports=['mmwf'])``)::

        optim_wrapper = dict(type='OptimWrapper', constructor='LayerDecayOptimWrapperConstructor',
                             optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.1),
                             paramwise_cfg=dict(num_layers=17, decay_rate=0.7))
    """

    STEM = ('patch_embed', 'init_norm', 'pos_embed', 'cls_token')

    def layer_id(self, name: str, num_layers: int) -> int:
        name = name.removeprefix('student.')  # a model wrapped by AttentionDistiller
        name = name[len('backbone.'):] if name.startswith('backbone.') else None
        if name is None:
            return num_layers + 1
        if name.split('.')[0] in self.STEM:
            return 0
        match = re.match(r'blocks\.(\d+)\.', name)
        return int(match.group(1)) + 1 if match else num_layers + 1

    def add_params(self, params: list[dict], module: nn.Module, **kwargs) -> None:
        cfg = self.paramwise_cfg
        if 'num_layers' not in cfg or 'decay_rate' not in cfg:
            raise ValueError('LayerDecayOptimWrapperConstructor needs paramwise_cfg=dict(num_layers=..., '
                             'decay_rate=...)')
        num_layers, decay = cfg['num_layers'], cfg['decay_rate']
        no_decay_names = tuple(cfg.get('no_decay_names', ('pos_embed', 'cls_token')))
        norm_params = {id(p) for m in module.modules() if isinstance(m, NORMS) for p in m.parameters(False)}
        groups: dict[tuple[int, bool], dict] = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            lid = self.layer_id(name, num_layers)
            no_wd = id(param) in norm_params or any(n in name for n in no_decay_names)
            group = groups.setdefault((lid, no_wd), dict(
                params=[], lr=self.base_lr * decay ** (num_layers + 1 - lid),
                weight_decay=0.0 if no_wd else self.base_wd))
            group['params'].append(param)
        for (lid, _), group in sorted(groups.items()):
            print_log(f'layer {lid}: lr {group["lr"]:.3g}, weight decay {group["weight_decay"]}, '
                      f'{len(group["params"])} tensors', logger='current')
            params.append(group)
