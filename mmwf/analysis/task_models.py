"""mmdet / mmseg / mmpretrain configs as the networks they test, for counting, benchmarking and export."""
from __future__ import annotations

import torch.nn as nn


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


def det_samples(shape: tuple[int, int]) -> list:
    """One mmdet data sample of an unscaled, unpadded ``shape`` (H, W) image, for running a detector's heads."""
    from mmdet.structures import DetDataSample
    return [DetDataSample(metainfo=dict(img_shape=shape, ori_shape=shape, pad_shape=shape, scale_factor=(1., 1.),
                                        batch_input_shape=shape))]
