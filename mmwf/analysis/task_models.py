"""Inputs for running a task model's heads alone (the networks come from :func:`mmwf.configs.build_task_model`)."""
from __future__ import annotations


def det_samples(shape: tuple[int, int]) -> list:
    """One mmdet data sample of an unscaled, unpadded ``shape`` (H, W) image, for running a detector's heads."""
    from mmdet.structures import DetDataSample
    return [DetDataSample(metainfo=dict(img_shape=shape, ori_shape=shape, pad_shape=shape, scale_factor=(1., 1.),
                                        batch_input_shape=shape))]
