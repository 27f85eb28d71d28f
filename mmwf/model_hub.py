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
    checkpoint (``backbone.`` keys; the backbone holds the head), checked key by key and shape by shape against the
    model's config before mmpretrain's lenient load (a file of another model is a ``CheckpointMismatchError``)."""
    from mmengine.config import Config

    from mmwf.registry import MODELS
    from mmwf.utils.checkpoint import CheckpointMismatchError, load_state_dict_file, mismatch_lines, state_dict_mismatch
    name = filename[len(SCHEME):]
    model = metafile_models().get(name, {})
    weights = model.get('Weights')
    if weights is None:
        raise KeyError(f'{filename}: {name!r} is not a model of mmwf\'s model index with released weights')
    try:
        state = load_state_dict_file(weights, map_location or 'cpu')
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f'{err}\nFor {filename}, put the file in the Hugging Face cache (`hf download` of that repository, then '
            'HF_HUB_OFFLINE=1), or load a local copy strictly: model = get_model(NAME); '
            'mmwf.utils.load_strict(model.backbone, mmwf.utils.load_state_dict_file(PATH), PATH). (get_model\'s '
            'pretrained=PATH takes a classifier checkpoint, with backbone. keys; it refuses the release\'s file.)'
            ) from None
    backbone = dict(Config.fromfile(str(CONFIG_ROOT.parent / model['Config'])).model.backbone, init_cfg=None)
    mismatch = state_dict_mismatch(MODELS.build(backbone).state_dict(), state)
    if mismatch:
        raise CheckpointMismatchError('\n'.join([f'{weights} (the weights of {filename}) does not match {name}\'s '
                                                 f'backbone:', *mismatch_lines(mismatch)]))
    return dict(state_dict={f'backbone.{k}': v for k, v in state.items()}, meta=dict(source=weights))


def register_mmpretrain_models() -> list[str]:
    """Register mmwf's ImageNet classifiers with mmpretrain's ``ModelHub`` (once), through its public API: the
    metafile as ``ModelHub.register_model_index`` takes it, each released model's weights named ``mmwf://<name>``
    (a scheme registered with mmengine's ``CheckpointLoader.register_scheme``). Returns the names."""
    import tempfile

    import yaml
    from mmengine.runner import CheckpointLoader
    from mmpretrain.apis import ModelHub
    names = sorted(m['Name'] for m in metafile_models().values() if m['Config'].startswith('configs/imagenet/'))
    if not all(ModelHub.has(name) for name in names):
        index = yaml.safe_load(METAFILE.read_text())
        for model in index['Models']:
            if model.get('Weights'):
                model['Weights'] = f'{SCHEME}{model["Name"]}'
        with tempfile.TemporaryDirectory() as folder:
            path = f'{folder}/metafile.yml'
            with open(path, 'w') as f:
                yaml.safe_dump(index, f, sort_keys=False)
            ModelHub.register_model_index(path, config_prefix=CONFIG_ROOT.parent)
    try:
        CheckpointLoader.register_scheme(prefixes=SCHEME, loader=_load_released)
    except KeyError:  # registered by an earlier call
        pass
    return names


register_mmpretrain_models()
