"""ViTBaselinePyramid: ViT-Adapter's plain-ViT baseline levels."""
import pytest
import torch
import torch.nn.functional as F

from mmwf.models.necks import ViTBaselinePyramid
from tests.reference import randomised


def channel_norm(x, norm):
    """LayerNorm over the channels of a map, written out."""
    mean = x.mean(1, keepdim=True)
    var = x.var(1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-6) * norm.weight[:, None, None] + norm.bias[:, None, None]


def test_levels_are_normalised_and_resampled_to_strides_4_to_32():
    neck = ViTBaselinePyramid(64)
    randomised(neck.norms)
    feats = tuple(torch.randn(2, 64, 6, 10) for _ in range(4))
    out = neck(feats)
    assert [o.shape for o in out] == [(2, 64, 24, 40), (2, 64, 12, 20), (2, 64, 6, 10), (2, 64, 3, 5)]
    assert torch.allclose(out[2], channel_norm(feats[2], neck.norms[2]), atol=1e-5)
    normed = channel_norm(feats[3], neck.norms[3])
    assert torch.allclose(out[3], normed.unflatten(2, (3, 2)).unflatten(4, (5, 2)).amax((3, 5)), atol=1e-5)
    up2 = F.conv_transpose2d(channel_norm(feats[1], neck.norms[1]), neck.up2.weight, neck.up2.bias, stride=2)
    assert torch.allclose(out[1], up2, atol=1e-5)


def test_other_than_four_levels_is_refused():
    with pytest.raises(ValueError, match=r'takes 4 backbone maps .*got 1'):
        ViTBaselinePyramid(32)((torch.randn(1, 32, 4, 4),))
