"""Initializers that load weights into mmwf's models: ``Pretrained`` applied strictly and last (mmengine's rule).

Backbones load released weights strictly: a family's ``checkpoint_filter_fn`` maps a checkpoint to the model's
keys (timm's pattern), then every key must match. Checkpoints of a whole detector, segmentor, classifier or
distiller load into a backbone by their ``backbone.`` (``student.backbone.``) keys.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from mmengine.logging import print_log

from mmwf.registry import WEIGHT_INITIALIZERS
from mmwf.utils.checkpoint import load_strict, read_state_dict


def load_pretrained(model: nn.Module, path: str, prefix: str | None = None,
                    map_location: str | torch.device = 'cpu') -> None:
    """Read ``path`` (:func:`mmwf.utils.checkpoint.read_state_dict`), map it with the model's
    ``checkpoint_filter_fn`` when it has one, and load it strictly."""
    hint = f"{getattr(model, 'WEIGHTS_HINT', '')} To train from scratch instead, set the backbone's init_cfg=None."
    state = read_state_dict(path, prefix, hint.strip(), map_location)
    filter_fn = getattr(model, 'checkpoint_filter_fn', None)
    if filter_fn is not None:
        state = filter_fn(state)
    load_strict(model, state, path)
    print_log(f'loaded {len(state)} tensors into {type(model).__name__} from {path}', logger='current')


@WEIGHT_INITIALIZERS.register_module()
class StrictPretrained:
    """Initializer loading a checkpoint strictly (:func:`load_pretrained`), where mmengine's ``Pretrained`` skips
    what does not match. mmwf's backbones load ``dict(type='Pretrained', ...)`` with this one
    (:func:`init_weights_pretrained_last`).

    Args:
        checkpoint (str): a local ``.pth`` (read weights-only) or ``.safetensors`` file, a URL, or a
            ``torchvision://`` / ``open-mmlab://`` / ``mmcls://`` name.
        prefix (str, optional): keep only the keys under this prefix, with or without its dot (e.g.
            ``'backbone'``). Defaults to None: the whole checkpoint, or the backbone of a whole-model checkpoint.
        map_location (str): where the tensors are loaded. Defaults to ``'cpu'``.
    """

    def __init__(self, checkpoint: str, prefix: str | None = None, map_location: str = 'cpu') -> None:
        self.checkpoint, self.prefix, self.map_location = checkpoint, prefix, map_location

    def __call__(self, module: nn.Module) -> None:
        load_pretrained(module, self.checkpoint, self.prefix, self.map_location)


# initializers that load weights, applied after every other init_cfg entry (mmengine's rule for ``Pretrained``)
LOADING_INITIALIZERS = ('Pretrained', 'StrictPretrained', 'SoftmaxTransfer')


def init_weights_pretrained_last(module: nn.Module, init_weights: Callable[[], None]) -> None:
    """Run ``init_weights`` (mmengine's ``BaseModule.init_weights`` of ``module``) keeping its contract for
    ``Pretrained``: every other ``init_cfg`` entry first, the loading entries last, in their order; ``Pretrained``
    loads strictly (:class:`StrictPretrained`). ``module.init_cfg`` is left as given."""
    from mmengine.model.weight_init import PretrainedInit
    given = module.init_cfg
    cfgs = [given] if isinstance(given, dict) else list(given or [])

    def loads(cfg: dict) -> bool:
        return cfg.get('type') in LOADING_INITIALIZERS or cfg.get('type') is PretrainedInit

    loading = [c for c in cfgs if loads(c)]
    if module.is_init or not loading:
        return init_weights()
    module.init_cfg = [c for c in cfgs if not loads(c)] or None
    try:
        init_weights()
    finally:
        module.init_cfg = given
    for cfg in loading:
        kind = cfg['type']
        WEIGHT_INITIALIZERS.build(dict(cfg, type='StrictPretrained' if kind in ('Pretrained', PretrainedInit)
                                       else kind))(module)
