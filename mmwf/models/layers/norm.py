import torch
import torch.nn as nn
import torch.nn.functional as F

from mmwf.registry import MODELS


@MODELS.register_module()
class LayerNorm2d(nn.LayerNorm):
    """Channel-wise LayerNorm of a (B, C, H, W) map, as in ViTDet's simple feature pyramid.

    The output keeps the input's memory format: a channels-last map is normalised in place of its NHWC memory
    (no copy) and stays channels-last; any other map comes back as a contiguous NCHW tensor, not a permuted view
    (mmcv's RoIAlign reads its input's memory as NCHW whatever its strides, so a view would scramble RoI features).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        y = y.permute(0, 3, 1, 2)
        return y if x.is_contiguous(memory_format=torch.channels_last) else y.contiguous()
