"""The modern block options of both families (RMSNorm, SwiGLU) against the formulas written out here, and the
released blocks unchanged by default."""
import pytest
import torch
import torch.nn.functional as F

import mmwf  # noqa: F401
from mmwf.models.backbones import DeiT, WeightFormer
from mmwf.models.backbones.deit import DeiTBlock
from mmwf.models.backbones.weightformer import WeightFormerBlock
from mmwf.models.layers import build_token_norm
from tests.reference import randomised


def rms_norm(x: torch.Tensor, gain: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean over channels of x^2 + eps) * g."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gain


def swiglu_ffn(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor
               ) -> torch.Tensor:
    """Swish(x W_gate + b_gate) * (x W_up + b_up) W_down + b_down, the gate rows first in the packed W1."""
    h = w2.shape[1]
    gate = x @ w1[:h].T + b1[:h]
    up = x @ w1[h:].T + b1[h:]
    return (gate * torch.sigmoid(gate) * up) @ w2.T + b2


def test_rmsnorm_is_the_formula():
    norm = build_token_norm(dict(type='RMSNorm'), 24)
    randomised(norm, 0.3, vector_mean=0.5)
    x = torch.randn(3, 5, 24) * 4 + 1
    torch.testing.assert_close(norm(x), rms_norm(x, norm.weight))
    with pytest.raises(ValueError, match="choose|one of \\['LN', 'RMSNorm'\\]"):
        build_token_norm(dict(type='BN'), 24)


def test_deit_block_with_rmsnorm_and_swiglu_is_the_modern_block():
    """x + attn(RMS(x)), then x + SwiGLU(RMS(x)), hidden width 8/3 C."""
    block = DeiTBlock(48, 3, 4, dict(type='SoftmaxAttention'), norm_cfg=dict(type='RMSNorm'), ffn_type='swiglu')
    randomised(block, 0.3, vector_mean=0.5)
    assert (block.mlp.fc1.out_features, block.mlp.fc2.in_features) == (2 * 128, 128)  # 8/3 * 48 = 128
    x = torch.randn(2, 16, 48)
    y = x + block.attn(rms_norm(x, block.norm1.weight), (4, 4))
    m = block.mlp
    expected = y + swiglu_ffn(rms_norm(y, block.norm2.weight), m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias)
    torch.testing.assert_close(block(x, (4, 4)), expected)


@pytest.mark.parametrize('grad', [False, True], ids=['inference', 'training'])
def test_weightformer_block_with_rmsnorm_and_swiglu(grad):
    """Static block: x + dwc(x), then + SwiGLU(RMS(x)) with linear1 the packed gate / up projections; the same in
    the in-place inference path and in training."""
    block = WeightFormerBlock(48, 4, dict(type='StaticDWConv'), dict(type='StaticLinear'), dict(type='StaticLinear'),
                              norm_stream=False, norm_cfg=dict(type='RMSNorm'), ffn_type='swiglu')
    randomised(block, 0.3, vector_mean=0.5)
    assert (block.linear1.out_features, block.linear2.in_features) == (256, 128)
    x = torch.randn(2, 16, 48)
    y = x + block.dwc(x, (4, 4))
    l1, l2 = block.linear1, block.linear2
    expected = y + swiglu_ffn(rms_norm(y, block.norm2.weight), l1.weight, l1.bias, l2.weight, l2.bias)
    with torch.set_grad_enabled(grad):
        torch.testing.assert_close(block(x, (4, 4)), expected.detach())


@pytest.mark.parametrize('family', [WeightFormer, DeiT])
def test_options_reach_every_norm_and_feed_forward_and_leave_the_default_released(family):
    arch = dict(embed_dims=48, depth=3, mlp_ratio=4, **({'num_heads': 3} if family is DeiT else {}))
    default = family(arch, num_classes=10)
    modern = family(arch, num_classes=10, norm_cfg=dict(type='RMSNorm'), ffn_type='swiglu')
    norms = [m for m in default.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and not any(isinstance(m, torch.nn.RMSNorm) for m in default.modules())
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in modern.modules())
    assert len([m for m in modern.modules() if isinstance(m, torch.nn.RMSNorm)]) == len(norms)
    def first_projection(block: torch.nn.Module) -> torch.nn.Module:
        return block.mlp.fc1 if family is DeiT else block.linear1
    assert [first_projection(b).out_features for b in default.blocks] == [192] * 3  # 4C
    assert [first_projection(b).out_features for b in modern.blocks] == [256] * 3  # gate and up, 8/3 C each
    x = torch.randn(2, 3, 64, 64)
    modern.forward_classifier(x).sum().backward()
    assert all(p.grad is not None for p in modern.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="ffn_type must be one of \\('mlp', 'swiglu'\\)"):
        family(arch, ffn_type='geglu')


def test_dynamic_first_linear_predicts_the_packed_projection():
    """With a dynamic linear1, SwiGLU's gate and up come from the one dynamic projection (2 x 8/3 C wide)."""
    model = WeightFormer(dict(embed_dims=48, depth=2, mlp_ratio=4), dynamic_blocks=[0], ffn_type='swiglu')
    block = model.blocks[0]
    assert type(block.linear1).__name__ == 'BilateralDynamicLinear' and block.linear1.out_features == 256
    x = torch.randn(1, 16, 48)
    with torch.no_grad():
        stream = block.norm1(x)  # a dynamic block normalises the stream first (the release)
        stream = stream + block.dwc(stream, (4, 4))
        packed = block.linear1(block.norm2(stream), (4, 4))
        gate, up = packed[..., :128], packed[..., 128:]
        expected = stream + block.linear2(F.silu(gate) * up, (4, 4))
        torch.testing.assert_close(block(x, (4, 4)), expected)
