import torch
import torch.nn as nn
import torch.nn.functional as F

from mmwf.registry import MODELS


@MODELS.register_module()
class LN2d(nn.LayerNorm):
    """Channel-wise LayerNorm of a (B, C, H, W) map, as in ViTDet's simple feature pyramid."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)
