import torch
import torch.nn as nn
import torch.nn.functional as F

from mmwf.registry import MODELS

# the token norms of the blocks (``norm_cfg``): the released LayerNorm, or RMSNorm (x / sqrt(mean(x^2) + eps) * g)
TOKEN_NORMS = {'LN': nn.LayerNorm, 'RMSNorm': nn.RMSNorm}


def build_token_norm(norm_cfg: dict, dim: int) -> nn.Module:
    """The norm over the last (channel) dimension that ``norm_cfg`` names: ``dict(type='LN' | 'RMSNorm', eps=...)``
    (eps defaults to 1e-6, the release's), with a learnt scale (and for LN a shift)."""
    kind = norm_cfg.get('type')
    if kind not in TOKEN_NORMS or set(norm_cfg) - {'type', 'eps'}:
        raise ValueError(f'norm_cfg={dict(norm_cfg)}: give dict(type=T) or dict(type=T, eps=e) with T one of '
                         f'{sorted(TOKEN_NORMS)}')
    return TOKEN_NORMS[kind](dim, eps=norm_cfg.get('eps', 1e-6))


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
