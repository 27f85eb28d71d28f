"""The feature levels of ViT-Adapter's plain-ViT baseline (Chen et al., 2023), as a neck.

ViT-Adapter's ``ViTBaseline`` backbone (``detection/mmdet_custom/models/backbones/vit_baseline.py``) takes four block
outputs of a plain ViT at stride 16, normalises each with its own LayerNorm and brings them to strides 4, 8, 16 and
32. Here the backbone (our ``DeiT``, ``out_indices=(2, 5, 8, 11)``) returns the maps and this neck does the rest;
mmdet's FPN follows it for detection, UPerHead reads it directly for segmentation.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from mmwf.models.layers import LayerNorm2d
from mmwf.registry import MODELS


@MODELS.register_module()
class ViTBaselinePyramid(BaseModule):
    """Four stride-16 maps (B, C, H, W) -> (B, C, 4H, 4W), (B, C, 2H, 2W), (B, C, H, W), (B, C, H/2, W/2):
    LayerNorm per level (``norms``, eps 1e-6), then ``up1`` = ConvTranspose2d(2, 2) -> GroupNorm(32) -> GELU ->
    ConvTranspose2d(2, 2), ``up2`` = ConvTranspose2d(2, 2), ``up3`` = identity, ``up4`` = MaxPool2d(2).

    Args:
        in_channels (int): C, the width of the backbone's maps (and of every output level).
        num_groups (int): GroupNorm groups of ``up1``. Defaults to 32.
        init_cfg (dict | list[dict], optional): mmengine init config. Defaults to None: ViT-Adapter's init of the
            resampling convolutions (normal, std sqrt(2 / fan-out), zero bias).
    """

    def __init__(self, in_channels: int, num_groups: int = 32, init_cfg: dict | list | None = None) -> None:
        super().__init__(init_cfg=init_cfg)
        c = in_channels
        self.norms = nn.ModuleList(LayerNorm2d(c, eps=1e-6) for _ in range(4))
        self.up1 = nn.Sequential(nn.ConvTranspose2d(c, c, 2, 2), nn.GroupNorm(num_groups, c), nn.GELU(),
                                 nn.ConvTranspose2d(c, c, 2, 2))
        self.up2 = nn.ConvTranspose2d(c, c, 2, 2)
        self.up3 = nn.Identity()
        self.up4 = nn.MaxPool2d(kernel_size=2, stride=2)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
                nn.init.normal_(m.weight, 0, math.sqrt(2.0 / fan_out))
                nn.init.zeros_(m.bias)

    def forward(self, feats: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if len(feats) != 4:
            raise ValueError(f'ViTBaselinePyramid takes 4 backbone maps (out_indices of 4 blocks, e.g. (2, 5, 8, 11)); '
                             f'got {len(feats)}')
        ups = (self.up1, self.up2, self.up3, self.up4)
        return tuple(up(norm(f)) for up, norm, f in zip(ups, self.norms, feats))
