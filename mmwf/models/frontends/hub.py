"""The Hugging Face hub front end of mmwf's backbones: :class:`HubModel`, the hub mixin they inherit.

``save_pretrained`` / ``push_to_hub`` write the constructor's arguments as ``config.json``, the weights as
``model.safetensors`` and a model card that says how to load and use the model; ``from_pretrained`` reads them back
through the family's ``checkpoint_filter_fn`` and one strict load, and a family reads its release's hub repositories
as they are (:meth:`HubModel.hub_arguments`). A model with a classifier head comes back as the hub's users expect
it, its forward giving the logits (B, num_classes) (``out_type='timm'``; mmpretrain's 1-tuple form, ``'logits'``,
is how mmpretrain calls it, not how it is saved); a backbone without one gives its maps.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from huggingface_hub import ModelCard, PyTorchModelHubMixin, constants, hf_hub_download
from mmengine.logging import print_log

from mmwf.utils.checkpoint import load_state_dict_file, load_strict, mismatch_lines

MODEL_CARD = """
---
{{ card_data }}
---

# {{ model_class }} (mmwf)

A {{ what }} of [mmwf](https://arxiv.org/abs/2605.01711), saved with `save_pretrained`: `config.json` holds the
arguments of `{{ model_class }}`, `model.safetensors` its weights.

```python
import torch
from {{ module }} import {{ model_class }}

model = {{ model_class }}.from_pretrained('REPO_OR_FOLDER')  # the weights loaded strictly, eval mode
out = model(torch.randn(1, 3, 224, 224))  # {{ output }}
```

`timm.create_model` and mmdet / mmseg / mmpretrain configs take the same weights
(`init_cfg=dict(type='Pretrained', checkpoint='.../model.safetensors')`); mmwf's documentation (its `docs/`, built by
`make docs`) has the guides: `guides/frontends.md` for the hub.

- Paper: {{ paper_url }}
- Code of the release: {{ repo_url }}
"""


class HubModel(PyTorchModelHubMixin, library_name='mmwf', tags=['vision', 'mmwf'],
               repo_url='https://github.com/LeapLabTHU/WeightFormer', paper_url='https://arxiv.org/abs/2605.01711',
               model_card_template=MODEL_CARD):
    """``PyTorchModelHubMixin`` with mmwf's loader: the model of ``config.json``, its weights loaded strictly. A class
    using it has ``checkpoint_filter_fn(state_dict)`` (a release's keys -> its own), ``num_classes`` and
    ``out_type``."""

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        """The model card: how to load this class's model and what its forward returns."""
        classifier = bool(getattr(self, 'num_classes', 0))
        return ModelCard.from_template(
            card_data=self._hub_mixin_info.model_card_data, template_str=self._hub_mixin_info.model_card_template,
            repo_url=self._hub_mixin_info.repo_url, paper_url=self._hub_mixin_info.paper_url,
            model_class=type(self).__name__, module=type(self).__module__.rsplit('.', 1)[0],
            what='classifier' if classifier else 'backbone',
            output=(f'logits (1, {self.num_classes})' if classifier else
                    'the feature maps of out_indices, (1, C, H/16, W/16) each'), **kwargs)

    @classmethod
    def hub_arguments(cls, config: dict) -> dict:
        """A hub repository's ``config.json`` -> this family's constructor arguments: one written by
        ``save_pretrained`` as it is (a family converts its release's configs here); anything else is an error
        naming the keys."""
        params = set(cls._hub_mixin_init_parameters) - {'self'}
        unknown = sorted(set(config) - params)
        if unknown:
            raise ValueError(f'{cls.__name__}.from_pretrained: config.json has keys {unknown} that are not '
                             f'{cls.__name__} arguments ({", ".join(sorted(params))}); it was written for another '
                             'model. Load it with the class that wrote it.')
        return dict(config)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None, cache_dir: str | Path | None,
                         force_download: bool, local_files_only: bool, token: str | bool | None,
                         config: dict | None = None, map_location: str = 'cpu', strict: bool = True,
                         **model_kwargs) -> HubModel:
        """The hub mixin's loader: the model of ``config.json`` (:meth:`hub_arguments`; a classifier with its logits
        from forward; keyword arguments override it, ``init_cfg`` is dropped: the weights are the repository's),
        then ``model.safetensors`` through :meth:`checkpoint_filter_fn` and a strict load (``strict=False`` lists
        what did not match and goes on)."""
        model_kwargs.pop('config', None)
        saved = config or {}
        # the hub mixin passes config.json's values as keyword arguments too: they are not the caller's choices
        chosen = {k: v for k, v in model_kwargs.items() if k not in saved or saved[k] != v}
        kwargs = cls.hub_arguments(saved)
        if kwargs.get('num_classes') and kwargs.get('out_type') == 'logits':
            kwargs['out_type'] = 'timm'  # a classifier: its forward gives the logits
        kwargs = {**kwargs, **chosen}
        kwargs.pop('init_cfg', None)
        model = cls(**kwargs)
        if os.path.isdir(model_id):
            path = os.path.join(model_id, constants.SAFETENSORS_SINGLE_FILE)
        else:
            path = hf_hub_download(repo_id=model_id, filename=constants.SAFETENSORS_SINGLE_FILE, revision=revision,
                                   cache_dir=cache_dir, force_download=force_download,
                                   local_files_only=local_files_only, token=token)
        state = model.checkpoint_filter_fn(load_state_dict_file(path, map_location))
        mismatch = load_strict(model, state, path, strict=strict)
        if mismatch:
            print_log('\n'.join([f'{path}: loaded with strict=False; what did not match:', *mismatch_lines(mismatch)]),
                      logger='current', level=logging.WARNING)
        return model.to(map_location).eval()

