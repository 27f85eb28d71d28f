"""ViTDet's simple feature pyramid (Li et al., "Exploring Plain Vision Transformer Backbones for Object
Detection", 2022), with channel-wise LayerNorm (LayerNorm2d), as detectron2's ``SimpleFeaturePyramid``."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from mmwf.models.layers import LayerNorm2d
from mmwf.registry import MODELS


def conv_ln(in_channels: int, out_channels: int, kernel_size: int) -> nn.Sequential:
    """Conv (no bias) -> LayerNorm2d."""
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False),
                         LayerNorm2d(out_channels, eps=1e-6))


@MODELS.register_module()
class SimpleFeaturePyramid(BaseModule):
    """One 1/p map -> a pyramid with strides p/4, p/2, p, 2p (scale factors 4, 2, 1, 0.5) and a last level
    max-pooled from the coarsest (kernel 1, stride 2).

    Scale 4: ConvTranspose 2x2 s2 -> LayerNorm2d -> GELU -> ConvTranspose 2x2 s2 (C -> C/2 -> C/4); scale 2: one
    ConvTranspose (C -> C/2); scale 1: identity; scale 0.5: MaxPool 2. Each level then takes a 1x1 and a
    3x3 conv to ``out_channels``, each without bias and followed by LayerNorm2d.

    Args:
        in_channels (int): C of the backbone map.
        out_channels (int): channels of every level. Defaults to 256.
        scale_factors (Sequence[float]): resampling of each level. Defaults to (4.0, 2.0, 1.0, 0.5).
        num_outs (int): number of levels returned; one more than ``scale_factors`` adds the max-pooled level.
            Defaults to 5.
        in_index (int): which backbone output to use. Defaults to -1.
        init_cfg (dict | list[dict], optional): mmengine init config. Defaults to None.

    Input: tuple of (B, C, H, W) maps. Output: tuple of (B, out_channels, H*s, W*s) maps.
    """

    def __init__(self, in_channels: int, out_channels: int = 256,
                 scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5), num_outs: int = 5,
                 in_index: int = -1, init_cfg: dict | list | None = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if num_outs not in (len(scale_factors), len(scale_factors) + 1):
            raise ValueError(f'num_outs must be {len(scale_factors)} or {len(scale_factors) + 1}, got {num_outs}')
        self.num_outs, self.in_index = num_outs, in_index
        dim = in_channels
        self.stages = nn.ModuleList()
        for scale in scale_factors:
            if scale == 4.0:
                layers, out_dim = [nn.ConvTranspose2d(dim, dim // 2, 2, 2), LayerNorm2d(dim // 2, eps=1e-6), nn.GELU(),
                                   nn.ConvTranspose2d(dim // 2, dim // 4, 2, 2)], dim // 4
            elif scale == 2.0:
                layers, out_dim = [nn.ConvTranspose2d(dim, dim // 2, 2, 2)], dim // 2
            elif scale == 1.0:
                layers, out_dim = [], dim
            elif scale == 0.5:
                layers, out_dim = [nn.MaxPool2d(2, 2)], dim
            else:
                raise ValueError(f'scale factor {scale} is not supported (4, 2, 1, 0.5)')
            self.stages.append(nn.Sequential(*layers, conv_ln(out_dim, out_channels, 1),
                                             conv_ln(out_channels, out_channels, 3)))

    def forward(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        # the stages run channels-last (mkldnn's native layout; LayerNorm2d then needs no permute copies), and
        # every level is returned as a contiguous NCHW map, the layout RoIAlign reads
        x = inputs[self.in_index].contiguous(memory_format=torch.channels_last)
        outs = [stage(x) for stage in self.stages]
        if self.num_outs > len(outs):
            outs.append(F.max_pool2d(outs[-1], kernel_size=1, stride=2))
        return tuple(out.contiguous() for out in outs)
