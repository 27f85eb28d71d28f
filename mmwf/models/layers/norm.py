import torch
import torch.nn as nn
import torch.nn.functional as F

from mmwf.registry import MODELS


@MODELS.register_module()
class LayerNorm2d(nn.LayerNorm):
    """Channel-wise LayerNorm of a (B, C, H, W) map, as in ViTDet's simple feature pyramid.

    Returns a contiguous (B, C, H, W) tensor, not a permuted view: mmcv's RoIAlign reads its input's memory as
    NCHW whatever its strides, so a channels-last view would give it scrambled RoI features.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2).contiguous()
