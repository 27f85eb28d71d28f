"""The Hugging Face hub front end of mmwf's backbones: :class:`HubModel`, the hub mixin they inherit.

``save_pretrained`` / ``push_to_hub`` write the constructor's arguments as ``config.json`` and the weights as
``model.safetensors``; ``from_pretrained`` reads them back through the family's ``checkpoint_filter_fn`` and one
strict load, and a family reads its release's hub repositories as they are (:meth:`HubModel.hub_arguments`).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from huggingface_hub import PyTorchModelHubMixin, constants, hf_hub_download
from mmengine.logging import print_log

from mmwf.utils.checkpoint import load_state_dict_file, load_strict, mismatch_lines


class HubModel(PyTorchModelHubMixin, library_name='mmwf', tags=['vision', 'mmwf'],
               repo_url='https://github.com/LeapLabTHU/WeightFormer', paper_url='https://arxiv.org/abs/2605.01711'):
    """``PyTorchModelHubMixin`` with mmwf's loader: the model of ``config.json``, its weights loaded strictly. A class
    using it has ``checkpoint_filter_fn(state_dict)`` (a release's keys -> its own)."""

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
        """The hub mixin's loader: the model of ``config.json`` (:meth:`hub_arguments`; keyword arguments override
        it, ``init_cfg`` is dropped: the weights are the repository's), then ``model.safetensors`` through
        :meth:`checkpoint_filter_fn` and a strict load (``strict=False`` lists what did not match and goes on)."""
        model_kwargs.pop('config', None)
        kwargs = {**cls.hub_arguments(config or {}), **model_kwargs}
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

