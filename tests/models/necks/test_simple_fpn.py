import pytest
import torch

from mmwf.models.backbones import WeightFormer
from mmwf.models.layers import LayerNorm2d
from mmwf.models.necks import SimpleFeaturePyramid
from tests.reference import randomised


def test_levels_and_strides():
    neck = SimpleFeaturePyramid(32, out_channels=16)
    outs = neck((torch.randn(2, 32, 6, 10),))
    assert [tuple(o.shape) for o in outs] == [(2, 16, 24, 40), (2, 16, 12, 20), (2, 16, 6, 10), (2, 16, 3, 5),
                                              (2, 16, 2, 3)]
    assert all(o.is_contiguous() for o in outs)
    sum(o.sum() for o in outs).backward()


def test_roi_align_sees_the_pyramid_values():
    """mmcv's RoIAlign reads its input's memory as NCHW: on every level it must give the RoI features of a
    contiguous copy (a channels-last view from LayerNorm2d once scrambled every RoI the cascade heads saw)."""
    from mmcv.ops import roi_align
    neck = SimpleFeaturePyramid(32, out_channels=16).eval()
    with torch.no_grad():
        outs = neck((torch.randn(2, 32, 8, 8),))
    rois = torch.tensor([[0, 8.0, 4.0, 60.0, 50.0], [1, 20.0, 30.0, 120.0, 110.0]])
    for level, out in enumerate(outs):
        scale = 1 / 2 ** (level + 2)
        got = roi_align(out, rois, (7, 7), scale, 0, 'avg', True)
        assert torch.equal(got, roi_align(out.clone(memory_format=torch.contiguous_format), rois, (7, 7), scale, 0,
                                          'avg', True))
        assert got.abs().sum() > 0


def test_ln2d_is_channel_layernorm():
    ln = randomised(LayerNorm2d(8))
    x = torch.randn(2, 8, 3, 5)
    ref = torch.nn.functional.layer_norm(x.permute(0, 2, 3, 1), (8,), ln.weight, ln.bias, ln.eps).permute(0, 3, 1, 2)
    out = ln(x)
    assert torch.allclose(out, ref, atol=1e-6)
    assert out.is_contiguous()
    # a channels-last map is normalised in its own layout (no copy) and stays channels-last
    nhwc = ln(x.contiguous(memory_format=torch.channels_last))
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and not nhwc.is_contiguous()
    assert torch.allclose(nhwc, ref, atol=1e-6)


def test_weightformer_t_with_pyramid_matches_protocol_params():
    """docs/protocol.md: WF-T + SimpleFPN = 9.55M params (their FLOPs at 1024, 77.4G in the released order, are the
    metafile's, checked by tests/test_model_index.py; the two orders by tests/analysis/test_complexity.py)."""
    model = torch.nn.Sequential(WeightFormer('t'), SimpleFeaturePyramid(192))
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(9.55e6, rel=1e-3)


def test_bad_scale_factor_is_rejected():
    with pytest.raises(ValueError, match='scale factor 3'):
        SimpleFeaturePyramid(32, scale_factors=(3.0,), num_outs=1)
