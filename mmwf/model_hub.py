"""mmwf's ImageNet classifiers in mmpretrain's model hub.

``import mmwf.model_hub`` (or :func:`register_mmpretrain_models`) adds the models of ``configs/imagenet/metafile.yml``
to mmpretrain's ``ModelHub`` under their config names, so that mmpretrain's ``list_models('weightformer*')``,
``get_model('weightformer_t_in1k', pretrained=True)``, ``inference_model`` and ``ImageClassificationInferencer``
take them. ``import mmwf`` does not do this (it does not import mmpretrain).

A model's released weights (its metafile ``Weights``: the release's backbone-layout ``model.safetensors`` on the
Hugging Face hub) reach mmpretrain's loader as ``mmwf://<model name>``, a checkpoint scheme this module adds to
mmengine's ``CheckpointLoader`` (a new name; every existing scheme stays as it was): read weights-only from the hub's
cache (:func:`mmwf.utils.checkpoint.load_state_dict_file`) and laid out as the classifier's ``backbone.`` keys.
"""
from __future__ import annotations

import torch

from mmwf.configs import CONFIG_ROOT, metafile_models

SCHEME = 'mmwf://'
METAFILE = CONFIG_ROOT / 'imagenet' / 'metafile.yml'


def _load_released(filename: str, map_location: str | torch.device | None = None) -> dict:
    """mmengine checkpoint loader for ``mmwf://<model name>``: the model's ``Weights`` as an mmpretrain classifier
    checkpoint (``backbone.`` keys; the backbone holds the head)."""
    from mmwf.utils.checkpoint import load_state_dict_file
    name = filename[len(SCHEME):]
    weights = metafile_models().get(name, {}).get('Weights')
    if weights is None:
        raise KeyError(f'{filename}: {name!r} is not a model of mmwf\'s model index with released weights')
    state = load_state_dict_file(weights, map_location or 'cpu')
    return dict(state_dict={f'backbone.{k}': v for k, v in state.items()}, meta=dict(source=weights))


def register_mmpretrain_models() -> list[str]:
    """Register mmwf's ImageNet classifiers with mmpretrain's ``ModelHub`` (once), their released weights as
    ``mmwf://<name>``. Returns the names."""
    from mmengine.runner import CheckpointLoader
    from mmpretrain.apis import ModelHub
    names = sorted(m['Name'] for m in metafile_models().values() if m['Config'].startswith('configs/imagenet/'))
    if not all(ModelHub.has(name) for name in names):
        ModelHub.register_model_index(METAFILE, config_prefix=CONFIG_ROOT.parent)
        for name in names:
            if ModelHub._models_dict[name].weights:
                ModelHub._models_dict[name].weights = f'{SCHEME}{name}'
    if SCHEME not in CheckpointLoader._schemes:
        CheckpointLoader.register_scheme(prefixes=SCHEME, loader=_load_released)
    return names


register_mmpretrain_models()
