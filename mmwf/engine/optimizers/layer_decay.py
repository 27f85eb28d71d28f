"""Layer-wise learning-rate decay for plain (non-hierarchical) backbones, as ViTDet and BEiT fine-tune."""
from __future__ import annotations

import re
from collections.abc import Callable

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor

from mmwf.registry import OPTIM_WRAPPER_CONSTRUCTORS

NORMS = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
         nn.LocalResponseNorm)


def norm_params(module: nn.Module) -> set[int]:
    """ids of the parameters of every torch norm layer in ``module`` (LayerNorm2d included: it is an nn.LayerNorm)."""
    return {id(p) for m in module.modules() if isinstance(m, NORMS) for p in m.parameters(recurse=False)}


def named(module: nn.Module, *names: str) -> set[int]:
    """ids of the parameters whose own name (the last part) is one of ``names``."""
    return {id(p) for n, p in module.named_parameters() if n.rsplit('.', 1)[-1] in names}


def task_backbone(module: nn.Module) -> nn.Module:
    """The backbone of a detector / segmentor, inside an ``AttentionDistiller`` or not."""
    backbone = getattr(getattr(module, 'student', module), 'backbone', None)
    if backbone is None:
        raise ValueError(f'LayerDecayOptimWrapperConstructor needs a model with a backbone (layer ids count '
                         f'backbone.blocks); {type(module).__name__} has none')
    return backbone


# which parameters get no weight decay: each rule maps the model to the ids of those parameters
NO_DECAY_RULES: dict[str, Callable[[nn.Module], set[int]]] = {
    # every norm layer and the position embedding and class token (mmwf's default)
    'norms': lambda m: norm_params(m) | named(m, 'pos_embed', 'cls_token'),
    # detectron2's ViTDet: torch norm layers (weight_decay_norm=0) and pos_embed; its channel LN in the pyramid and the
    # heads is not a torch norm, and biases are decayed, so only the backbone's norms are exempt
    'vitdet': lambda m: norm_params(task_backbone(m)) | named(m, 'pos_embed'),
    # BEiT's / Vim's seg constructor: every 1-D parameter and every bias (its pos_embed / cls_token test compares
    # the full name 'backbone.pos_embed' with 'pos_embed' and never matches, so those are decayed)
    'beit': lambda m: {id(p) for n, p in m.named_parameters() if p.ndim == 1 or n.endswith('.bias')},
}


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Per-parameter lr = base_lr * decay_rate ** (num_layers + 1 - layer_id), and no weight decay on the
    parameters a named rule selects.

    Layer ids: 0 for the backbone stem (``patch_embed``, ``init_norm``, ``pos_embed``, ``cls_token``),
    i + 1 for ``backbone.blocks.{i}``, num_layers + 1 for everything else (the backbone's final norm, the
    neck and the heads); a ``student.`` prefix (``AttentionDistiller``) is ignored. ``paramwise_cfg``:

    - ``num_layers`` (int): blocks of the backbone (WeightFormer 17, DeiT 12). Defaults to the number of
      ``backbone.blocks``; any other value is refused.
    - ``decay_rate`` (float): e.g. 0.7 (ViTDet detection), 0.92 (UperNet segmentation).
    - ``reference_depth`` (int, optional): the depth ``decay_rate`` was tuned for; the rate per block becomes
      ``decay_rate ** (reference_depth / num_layers)``, so the stem's lr is the same fraction of the base lr at any
      depth (Vim's rule: 0.7 for DeiT's 12 blocks is 0.7 ** (12 / 17) = 0.777 for WeightFormer's 17). Defaults to
      None (the rate per block as given).
    - ``no_decay`` (str): which parameters have no weight decay: ``'norms'`` (every norm layer, ``pos_embed``
      and ``cls_token``), ``'vitdet'`` (detectron2 ViTDet: the backbone's norm layers and ``pos_embed``) or
      ``'beit'`` (BEiT / Vim segmentation: every 1-D parameter and bias). Defaults to ``'norms'``.

    Usage (any MMLab project, after ``custom_imports = dict(imports=['mmwf'])``)::

        optim_wrapper = dict(type='OptimWrapper', constructor='LayerDecayOptimWrapperConstructor',
                             optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.1),
                             paramwise_cfg=dict(decay_rate=0.7, reference_depth=12, no_decay='vitdet'))
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

    KEYS = ('num_layers', 'decay_rate', 'reference_depth', 'no_decay')

    def settings(self, module: nn.Module) -> tuple[int, float, str]:
        """(num_layers, decay_rate, no_decay) of ``paramwise_cfg``, checked against the model."""
        cfg = self.paramwise_cfg
        unknown = sorted(set(cfg) - set(self.KEYS))
        if unknown:
            raise ValueError(f'paramwise_cfg keys {unknown} are not implemented by LayerDecayOptimWrapperConstructor, '
                             f'which takes {", ".join(self.KEYS)}; remove them (mmengine\'s '
                             'DefaultOptimWrapperConstructor implements custom_keys, bias_decay_mult, ...)')
        decay = cfg.get('decay_rate')
        if not isinstance(decay, (int, float)) or not 0 < decay <= 1:
            raise ValueError(f'paramwise_cfg.decay_rate must be a number in (0, 1], e.g. 0.7 (ViTDet) or 0.92 '
                             f'(UperNet); got {decay!r}')
        depth = len(task_backbone(module).blocks)
        num_layers = cfg.get('num_layers', depth)
        if num_layers != depth:
            if num_layers < depth:
                worst = (f'the last {depth - num_layers} blocks would train at up to '
                         f'{decay ** (num_layers + 1 - depth):.2g}x the base lr')
            else:
                worst = f'every backbone lr would carry {num_layers - depth} extra decay steps'
            raise ValueError(f'paramwise_cfg.num_layers={num_layers} but the backbone '
                             f'({type(task_backbone(module)).__name__}) has {depth} blocks: {worst}. Set '
                             f'num_layers={depth} or leave it out (it is taken from the backbone)')
        reference = cfg.get('reference_depth')
        if reference is not None:
            if not isinstance(reference, int) or reference < 1:
                raise ValueError(f'paramwise_cfg.reference_depth must be a number of blocks (e.g. 12, DeiT\'s), got '
                                 f'{reference!r}')
            decay = decay ** (reference / num_layers)  # the decay over the whole trunk as at reference depth
        return num_layers, decay, cfg.get('no_decay', 'norms')

    def add_params(self, params: list[dict], module: nn.Module, **kwargs) -> None:
        num_layers, decay, rule = self.settings(module)
        if rule not in NO_DECAY_RULES:
            raise ValueError(f'paramwise_cfg.no_decay={rule!r} is not a rule; choose from {sorted(NO_DECAY_RULES)}')
        no_decay = NO_DECAY_RULES[rule](module)
        groups: dict[tuple[int, bool], dict] = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            lid = self.layer_id(name, num_layers)
            no_wd = id(param) in no_decay
            group = groups.setdefault((lid, no_wd), dict(params=[], lr=self.base_lr * decay ** (num_layers + 1 - lid)))
            if no_wd or self.base_wd is not None:  # else the optimizer's default weight decay
                group['weight_decay'] = 0.0 if no_wd else self.base_wd
            group['params'].append(param)
        for (lid, _), group in sorted(groups.items()):
            print_log(f'layer {lid}: lr {group["lr"]:.3g}, weight decay {group.get("weight_decay", "default")}, '
                      f'{len(group["params"])} tensors', logger='current')
            params.append(group)
