"""The timm front end of mmwf's backbones: each family's variants registered as timm models, built through timm's
``build_model_with_cfg`` (its pretrained configs, ``features_only``), their pretrained weights checked key by key.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import TYPE_CHECKING

import torch
from mmengine.logging import print_log

from mmwf.models.layers import FFN_TYPES
from mmwf.utils.checkpoint import CheckpointMismatchError, mismatch_lines, state_dict_mismatch, whole_model_part

if TYPE_CHECKING:
    from mmwf.models.backbones.base import PlainBackbone


def pretrained_source(cfg: dict) -> str:
    """Where timm took the pretrained weights from, by its ``pretrained_cfg``: the file, the hub model or the URL."""
    for key, what in (('file', 'file'), ('hf_hub_id', 'Hugging Face hub model'), ('url', 'URL')):
        if cfg.get(key):
            return f'{what} {cfg[key]}'
    return "the pretrained_cfg's state_dict"


def timm_checkpoint_filter(state_dict: dict[str, torch.Tensor], model: PlainBackbone,
                           strict: bool = True) -> dict[str, torch.Tensor]:
    """timm's ``pretrained_filter_fn``, strict where timm is lenient: a whole-model checkpoint reduced to its backbone
    (:func:`mmwf.utils.checkpoint.whole_model_part`), the family's :meth:`PlainBackbone.checkpoint_filter_fn`, then
    every key and shape compared with the model's before timm loads. Only the classifier may be left out, where the
    model's class count differs from the pretrained one's (timm then drops it; logged); anything else that does not
    fit (a checkpoint of another family or size) is a :class:`CheckpointMismatchError`, or with timm's
    ``pretrained_strict=False`` a logged list."""
    state = model.checkpoint_filter_fn(whole_model_part(state_dict, 'the timm checkpoint'))
    own, cfg = model.state_dict(), getattr(model, 'pretrained_cfg', None) or {}
    stem = f'{cfg.get("first_conv", "patch_embed.proj")}.weight'
    if stem in own and own[stem].shape[1] != cfg.get('input_size', own[stem].shape)[0]:  # timm adapts the channels
        own[stem] = own[stem].new_empty(own[stem].shape[:1] + (cfg['input_size'][0],) + own[stem].shape[2:])
    adapted = model.num_classes != cfg.get('num_classes', model.num_classes)
    if adapted:
        head = [k for k in state if k.startswith('head.')]
        own = {k: v for k, v in own.items() if not k.startswith('head.')}
        state = {k: v for k, v in state.items() if k not in head}
        print_log(f'timm pretrained weights: the classifier ({", ".join(head) or "none"}) left out for '
                  f'num_classes={model.num_classes}', logger='current')
    mismatch = state_dict_mismatch(own, state)
    if mismatch and strict:
        raise CheckpointMismatchError('\n'.join([
            f'timm pretrained weights ({pretrained_source(cfg)}) do not match {type(model).__name__} (is it a '
            'checkpoint of this model and size?).', *mismatch_lines(mismatch),
            'Give the weights of this architecture (pretrained_cfg_overlay=dict(file=...)), or pass '
            'pretrained_strict=False to load what fits on purpose (what is left out is logged).']))
    if mismatch:
        print_log('\n'.join(['pretrained_strict=False: timm pretrained weights loaded where they fit; left out:',
                              *mismatch_lines(mismatch)]), logger='current', level=logging.WARNING)
    return state


# timm's names for the blocks' options (``norm_layer``, ``mlp_layer``) -> the families' ``norm_cfg`` / ``ffn_type``
TIMM_NORM_LAYERS = {'layernorm': 'LN', 'rmsnorm': 'RMSNorm'}
TIMM_MLP_LAYERS = {name: name for name in FFN_TYPES}  # timm's names are ours


def _timm_option(value: str, table: dict, name: str) -> str:
    if value not in table:
        raise ValueError(f'{name}={value!r} is not an option of mmwf\'s timm models; choose from {sorted(table)}')
    return table[value]


def _timm_constructor(model_cls: type[PlainBackbone], in_chans: int = 3, num_classes: int = 1000,
                      norm_layer: str | None = None, mlp_layer: str | None = None,
                      device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                      **kwargs) -> PlainBackbone:
    """timm's model arguments (``in_chans``, ``norm_layer`` 'layernorm' / 'rmsnorm', ``mlp_layer`` 'mlp' /
    'swiglu', ``device``, ``dtype``) -> the family's; any other argument (``global_pool`` too) goes to the family,
    which refuses what it does not take (TypeError, as timm expects)."""
    if norm_layer is not None:
        kwargs['norm_cfg'] = dict(type=_timm_option(norm_layer, TIMM_NORM_LAYERS, 'norm_layer'))
    if mlp_layer is not None:
        kwargs['ffn_type'] = _timm_option(mlp_layer, TIMM_MLP_LAYERS, 'mlp_layer')
    with torch.device(device) if device is not None else nullcontext():
        model = model_cls(in_channels=in_chans, num_classes=num_classes, out_type='timm', **kwargs)
    return model.to(dtype=dtype) if dtype is not None else model


def create_timm_model(model_cls: type[PlainBackbone], variant: str, pretrained: bool = False,
                      **kwargs) -> PlainBackbone:
    """The model behind a registered timm name: timm's ``build_model_with_cfg`` on ``model_cls`` with the
    variant's ``pretrained_cfg``, :func:`timm_checkpoint_filter` for pretrained weights (strict unless
    ``pretrained_strict=False``), and timm's
    ``FeatureGetterNet`` (:meth:`PlainBackbone.forward_intermediates`, the last 3 blocks by default) for
    ``features_only=True``."""
    from timm.models import build_model_with_cfg
    strict = kwargs.get('pretrained_strict', True)
    return build_model_with_cfg(partial(_timm_constructor, model_cls), variant, pretrained,
                                pretrained_filter_fn=partial(timm_checkpoint_filter, strict=strict),
                                feature_cfg=dict(out_indices=3, feature_cls='getter'), **kwargs)


def register_timm_models(model_cls: type[PlainBackbone], variants: dict[str, dict], namespace: dict) -> None:
    """Register each of ``variants`` (timm name -> the family's arguments) with timm, as an entry point
    ``name(pretrained=False, **kwargs)`` of the family's module (``namespace``: its globals, where timm looks for
    ``default_cfgs`` and files the model), built by :func:`create_timm_model`."""
    from timm.models import register_model

    def entrypoint_of(name: str, variant: dict) -> Callable[..., PlainBackbone]:
        def entrypoint(pretrained: bool = False, **kwargs) -> PlainBackbone:
            return create_timm_model(model_cls, name, pretrained, **dict(variant, **kwargs))

        entrypoint.__name__ = entrypoint.__qualname__ = name
        entrypoint.__module__ = namespace['__name__']
        args = ', '.join(f'{k}={v!r}' for k, v in variant.items())
        entrypoint.__doc__ = f'timm model {name}: {model_cls.__name__}({args}).'
        return entrypoint

    for name, variant in variants.items():
        namespace[name] = register_model(entrypoint_of(name, variant))
