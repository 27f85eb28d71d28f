"""WeightFormer backbone: released-layout equivalence, any grid, strategy space, counts, numerics."""
import pytest
import torch
import torch.nn.functional as F

from mmwf.models.backbones import WeightFormer
from tests.cost import TensorShapes, saved_bytes
from tests.reference import linear_delta, released_state_dict, weightformer_forward

SMALL = dict(embed_dims=32, depth=5, mlp_ratio=2)


@pytest.fixture(scope='module')
def released_t(tmp_path_factory):
    sd = released_state_dict(192, 17)
    path = tmp_path_factory.mktemp('ckpt') / 'weightformer_t.pth'
    torch.save({'model': sd}, path)  # the release's training-checkpoint nesting
    return sd, str(path)


def test_released_layout_classifier_matches_reference(released_t):
    sd, path = released_t
    model = WeightFormer('t', num_classes=1000, init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    model.eval()
    img = torch.randn(2, 3, 224, 160)  # non-square on purpose: the release assumes a square grid
    with torch.no_grad():
        ours = model.forward_classifier(img)
        ref, _, _ = weightformer_forward(sd, img, 17)
    assert (ours - ref).abs().max() < 1e-4


def test_released_layout_dense_features_match_reference(released_t, tmp_path):
    sd, _ = released_t
    from safetensors.torch import save_file
    path = str(tmp_path / 'model.safetensors')  # the Hugging Face form
    save_file(sd, path)
    model = WeightFormer('t', out_indices=(4, 8, 12, 16), init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    model.eval()
    img = torch.randn(1, 3, 17 * 16 + 5, 11 * 16 + 9)  # odd grid 17 x 11, sizes not multiples of 16
    with torch.no_grad():
        outs = model(img)
        _, feats, (H, W) = weightformer_forward(sd, img, 17)
    assert (H, W) == (17, 11)
    expected = [feats[4], feats[8], feats[12],
                F.layer_norm(feats[16], (192,), sd['norm.weight'], sd['norm.bias'], 1e-6)]
    for o, e in zip(outs, expected):
        assert o.shape == (1, 192, H, W)
        assert (o - e.transpose(1, 2).reshape(1, 192, H, W)).abs().max() < 1e-4


def test_wrong_checkpoints_fail_with_key_lists(released_t, tmp_path):
    sd, _ = released_t
    partial = {k: v for k, v in sd.items() if not k.startswith('blocks.3.')}
    torch.save({'model': partial}, tmp_path / 'partial.pth')
    model = WeightFormer('t', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'partial.pth')))
    with pytest.raises(ValueError, match=r'missing keys \(8\): blocks\.3\.dwc\.bias'):
        model.init_weights()
    small = WeightFormer('s', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'partial.pth')))
    with pytest.raises(ValueError, match='shape mismatches'):
        small.init_weights()
    missing = WeightFormer('t', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'nope.pth')))
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        missing.init_weights()


def test_detector_checkpoint_prefix(released_t, tmp_path):
    sd, _ = released_t
    wrapped = {'backbone.' + k: v for k, v in sd.items() if not k.startswith('head')}
    wrapped['neck.conv.weight'] = torch.zeros(1)
    torch.save({'state_dict': wrapped, 'meta': {}}, tmp_path / 'det.pth')
    model = WeightFormer('t', init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'det.pth'),
                                            prefix='backbone.'))
    model.init_weights()
    assert torch.equal(model.blocks[1].linear1.w, sd['blocks.1.linear1.w'])


# ---------------------------------------------------------------- grids, strategies, training features
@pytest.mark.parametrize('size', [(64, 64), (96, 48), (80, 112), (33, 47)])
@pytest.mark.parametrize('batch', [1, 2])
def test_any_grid_train_and_eval(size, batch):
    model = WeightFormer(SMALL, out_indices=(1, 4), drop_path_rate=0.1)
    img = torch.randn(batch, 3, *size)
    hw = (size[0] // 16, size[1] // 16)
    outs = model(img)
    assert [o.shape for o in outs] == [(batch, 32, *hw)] * 2
    sum(o.sum() for o in outs).backward()
    model.eval()
    with torch.no_grad():
        assert model(img)[1].shape == (batch, 32, *hw)


def test_too_small_image_is_a_clear_error():
    with pytest.raises(ValueError, match='H, W >= 32'):
        WeightFormer(SMALL)(torch.randn(1, 3, 16, 64))


LINEARS = ['GAPDynamicLinear', 'LinearDynamicLinear', dict(type='LinearDynamicLinear', pool=False),
           'NonlinearDynamicLinear', 'DeepDynamicLinear', 'BilateralDynamicLinear']
DWCS = ['GAPDynamicDWConv', 'AdaptiveDynamicDWConv', 'AmpDirDynamicDWConv', 'ConvDynamicDWConv', None]


@pytest.mark.parametrize('linear', LINEARS)
@pytest.mark.parametrize('mlp', ['first', 'second', 'both'])
def test_dynamic_linear_strategies(linear, mlp):
    cfg = linear if isinstance(linear, dict) else dict(type=linear)
    model = WeightFormer(SMALL, dynamic_linear=cfg, dynamic_mlp=mlp, dynamic_dwc=None, out_indices=(4,))
    layer = model.blocks[1].linear1 if mlp != 'second' else model.blocks[1].linear2
    assert type(layer).__name__ == cfg['type']
    out = model(torch.randn(2, 3, 80, 48))[0]
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize('dwc', DWCS)
def test_dynamic_dwc_strategies(dwc):
    model = WeightFormer(SMALL, dynamic_dwc=dwc and dict(type=dwc), dynamic_mlp='none', out_indices=(4,))
    layer = model.blocks[1].dwc
    assert type(layer).__name__ == (dwc or 'StaticDWConv')
    out = model(torch.randn(2, 3, 96, 64))[0]
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_dynamic_dwc_is_per_sample():
    """Changing one image changes only that image's kernel: outputs of the other sample stay put."""
    from mmwf.models.layers import AdaptiveDynamicDWConv
    layer = AdaptiveDynamicDWConv(8).eval()
    x = torch.randn(2, 6 * 5, 8)
    y = layer(x, (6, 5))
    x2 = x.clone()
    x2[1] = torch.randn(30, 8) * 3
    y2 = layer(x2, (6, 5))
    assert torch.allclose(y[0], y2[0], atol=1e-6) and not torch.allclose(y[1], y2[1])


@pytest.mark.parametrize('hw', [(2, 3), (40, 34)])
def test_bilateral_both_evaluation_orders_match_formula(hw):
    """Few tokens take the release's order, many tokens the reordered one; both equal eq. 8 as released."""
    from mmwf.models.layers import BilateralDynamicLinear
    layer = BilateralDynamicLinear(16, 64)
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64)
    layer.double()
    assert torch.allclose(layer.delta(x, hw), linear_delta(layer, x, hw), atol=1e-12)


def test_dynamic_block_placement_and_static_baseline():
    released = WeightFormer('t')
    assert sorted(released.dynamic_ids) == [1, 4, 7, 10, 13, 16]
    explicit = WeightFormer(SMALL, dynamic_blocks=[0, 3])
    assert [type(b.linear1).__name__ for b in explicit.blocks] == \
        ['BilateralDynamicLinear', 'StaticLinear', 'StaticLinear', 'BilateralDynamicLinear', 'StaticLinear']
    baseline = WeightFormer('t', dynamic_blocks=[])
    assert not any('Dynamic' in type(m).__name__ for m in baseline.modules())
    every = WeightFormer(SMALL, dynamic_blocks=dict(every=2, offset=0))
    assert sorted(every.dynamic_ids) == [0, 2, 4]


def test_frozen_stages_and_checkpointing():
    model = WeightFormer(SMALL, frozen_stages=2, with_cp=True, out_indices=(4,))
    model.train()
    assert not model.patch_embed.proj.weight.requires_grad
    assert not any(p.requires_grad for p in model.blocks[1].parameters())
    assert all(p.requires_grad for p in model.blocks[2].parameters())
    assert not model.blocks[0].training and model.blocks[2].training
    ref = WeightFormer(SMALL, out_indices=(4,))
    ref.load_state_dict(model.state_dict())
    img = torch.randn(2, 3, 64, 48)
    torch.manual_seed(1)
    out = model(img)[0]
    out.sum().backward()
    out_ref = ref(img)[0]
    out_ref.sum().backward()
    assert torch.allclose(out, out_ref, atol=1e-5)
    assert torch.allclose(model.blocks[4].linear2.weight.grad, ref.blocks[4].linear2.weight.grad, atol=1e-5)


# ---------------------------------------------------------------- numerics and linearity
def test_fp16_autocast_at_1248_is_finite():
    """78 x 78 tokens (the largest input of the benchmarks) under fp16 autocast: the token sums of the dynamic layers
    stay finite (a narrow, every-block-dynamic network: the token count is what matters)."""
    model = WeightFormer(dict(embed_dims=32, depth=2, mlp_ratio=2), dynamic_blocks=[0, 1], out_indices=(0, 1))
    img = torch.randn(1, 3, 1248, 1248)
    with torch.autocast('cpu', dtype=torch.float16):
        outs = model(img)
        assert outs[-1].dtype == torch.float16
        loss = sum(o.float().square().mean() for o in outs)
    loss.backward()
    assert all(torch.isfinite(o).all() for o in outs)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_no_token_by_token_tensor():
    """No intermediate has two dimensions as large as the token count (no N x N map)."""
    model = WeightFormer('t', out_indices=(16,))
    n = 32 * 40
    with TensorShapes() as mode:
        model(torch.randn(1, 3, 32 * 16, 40 * 16))[0].sum().backward()
    assert len(mode.shapes) > 100
    assert not [s for s in mode.shapes if sum(d >= n for d in s) >= 2]


def test_activation_memory_is_linear_in_tokens():
    """Saved-for-backward bytes are affine in the token count: the increments from 16^2 -> 32^2 -> 64^2
    tokens grow 4x like the token increments (a quadratic term would make it about 20x)."""
    model = WeightFormer('t', out_indices=(16,))
    tokens = [(s // 16) ** 2 for s in (256, 512, 1024)]
    saved = [saved_bytes(lambda s=s: model(torch.randn(1, 3, s, s))[0].sum()) for s in (256, 512, 1024)]
    growth = (saved[2] - saved[1]) / (saved[1] - saved[0])
    assert growth == pytest.approx((tokens[2] - tokens[1]) / (tokens[1] - tokens[0]), rel=0.02)
