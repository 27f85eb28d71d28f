import math

import pytest
import timm
import torch

from mmwf.models.backbones import DeiT


@pytest.fixture(scope='module')
def timm_deit():
    return timm.create_model('deit_tiny_patch16_224').eval()


def test_global_attention_reproduces_timm(timm_deit, tmp_path):
    path = tmp_path / 'deit_tiny.pth'
    torch.save({'model': timm_deit.state_dict()}, path)  # the official DeiT nesting
    ours = DeiT('t', out_indices=(5, 11), num_classes=1000, init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    ours.init_weights()
    ours.eval()
    img = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        ref = timm_deit.forward_features(img)
        feats = ours(img)
        assert torch.allclose(ours.forward_classifier(img), timm_deit(img), atol=1e-5)
    assert feats[1].shape == (2, 192, 14, 14)
    assert torch.allclose(feats[1].flatten(2).transpose(1, 2), ref[:, 1:], atol=1e-5)


def keys_bicubic_matrix(n_in: int, n_out: int) -> torch.Tensor:
    """(n_out, n_in) 1-D bicubic interpolation, written from the formulas: Keys' kernel with a = -0.75, half-pixel
    centres (align_corners=False), border samples repeated."""
    a, m = -0.75, torch.zeros(n_out, n_in, dtype=torch.float64)

    def w(d):
        d = abs(d)
        return (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1 if d <= 1 else a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a
    for i in range(n_out):
        x = (i + 0.5) * n_in / n_out - 0.5
        x0 = math.floor(x)
        for k in (-1, 0, 1, 2):
            m[i, min(max(x0 + k, 0), n_in - 1)] += w(x - (x0 + k))
    return m


def antialiased_bicubic_matrix(n_in: int, n_out: int) -> torch.Tensor:
    """(n_out, n_in) 1-D antialiased bicubic resampling (PIL's, as timm converts checkpoints), written from the
    formulas: Keys' kernel with a = -0.5, stretched by the scale s = n_in / n_out when shrinking, at half-pixel
    centres; taps outside the input are dropped and each row normalised to sum 1."""
    a, s = -0.5, n_in / n_out
    stretch, m = max(s, 1.0), torch.zeros(n_out, n_in, dtype=torch.float64)

    def w(d):
        d = abs(d)
        return ((a + 2) * d ** 3 - (a + 3) * d ** 2 + 1 if d < 1 else
                a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a if d < 2 else 0.0)
    for i in range(n_out):
        for j in range(n_in):
            m[i, j] = w((j + 0.5 - (i + 0.5) * s) / stretch)
    return m / m.sum(1, keepdim=True)


def test_dense_backbone_skips_head_and_resamples_position_embedding_bicubically(timm_deit, tmp_path):
    """The 14 x 14 table of a 224 checkpoint, resampled at run time to a 21 x 30 grid (ViTDet's get_abs_pos: bicubic,
    no antialiasing), equals the hand-written bicubic interpolation; the head and class token are not loaded."""
    path = tmp_path / 'deit_tiny.pth'
    torch.save(timm_deit.state_dict(), path)
    model = DeiT('t', with_cls_token=False, window_size=14, window_block_indexes=(0, 1, 3, 4, 6, 7, 9, 10),
                 out_indices=(11,), init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model.init_weights()
    assert not hasattr(model, 'cls_token')
    table = timm_deit.pos_embed[0, 1:].detach().double().reshape(14, 14, -1)
    expected = torch.einsum('ih,hwc,jw->ijc', keys_bicubic_matrix(14, 21), table, keys_bicubic_matrix(14, 30))
    torch.testing.assert_close(model.patch_pos_embed((21, 30))[0].double(), expected.flatten(0, 1), rtol=0,
                               atol=1e-5)
    img = torch.randn(1, 3, 16 * 21, 16 * 30)  # grid 21 x 30: windows need padding
    out = model(img)[0]
    assert out.shape == (1, 192, 21, 30)
    out.mean().backward()
    assert model.pos_embed.grad is not None


@pytest.mark.parametrize('hw', [(6, 9), (5, 7)], ids=['windows tile the grid', 'zero-padded windows'])
def test_window_attention_is_global_attention_in_each_window(hw):
    """A window block (ViTDet) attends within each 3 x 3 window as global attention on that window's tokens alone; the
    grid is zero-padded (after norm1) to whole windows, the padded tokens dropped afterwards."""
    block = DeiT(dict(embed_dims=32, depth=1, num_heads=2, mlp_ratio=2), window_size=3,
                 window_block_indexes=(0,)).blocks[0].double().eval()
    H, W = hw
    x = torch.randn(2, H * W, 32, dtype=torch.float64)
    with torch.no_grad():
        y = block.norm1(x).reshape(2, H, W, 32)
        Hp, Wp = -(-H // 3) * 3, -(-W // 3) * 3
        y = torch.nn.functional.pad(y, (0, 0, 0, Wp - W, 0, Hp - H))
        attended = torch.zeros_like(y)
        for r in range(0, Hp, 3):
            for c in range(0, Wp, 3):
                window = y[:, r:r + 3, c:c + 3].reshape(2, 9, 32)
                attended[:, r:r + 3, c:c + 3] = block.attn(window, (3, 3)).reshape(2, 3, 3, 32)
        h = x + attended[:, :H, :W].reshape(2, H * W, 32)
        expected = h + block.mlp(block.norm2(h))
        torch.testing.assert_close(block(x, hw), expected, rtol=1e-12, atol=1e-12)


def test_window_partition_round_trip():
    from mmwf.models.layers import partition, unpartition
    x = torch.randn(2, 5 * 7, 4)
    windows = partition(x, (5, 7), (3, 3))
    assert windows.shape == (2, 2 * 3, 9, 4)
    assert torch.equal(windows[0, 1, :3], x[0, 3:6])  # second window of the first row: columns 3-5
    assert torch.equal(unpartition(windows, (5, 7), (3, 3)), x)


def test_windows_with_class_token_is_rejected():
    with pytest.raises(ValueError, match='with_cls_token=False'):
        DeiT('t', window_size=14, window_block_indexes=(0,), with_cls_token=True)
    assert not DeiT('t', window_size=14, window_block_indexes=(0,)).with_cls_token  # by default none with windows


@pytest.mark.parametrize('grid', [7, 24], ids=['smaller grid', 'larger grid'])
def test_checkpoint_of_another_grid_is_resampled_as_timm_does(tmp_path, grid):
    """A DeiT checkpoint trained at another size (grid x grid positions) loads into a 224 model: its position
    table is resampled to 14 x 14 as timm's checkpoint_filter_fn does (bicubic, antialiased: the hand-written
    resampling above), the class slot kept."""
    arch = dict(embed_dims=32, depth=1, num_heads=2, mlp_ratio=2)
    source = DeiT(arch, pretrain_size=16 * grid)
    state = {k: v + torch.randn_like(v) for k, v in source.state_dict().items()}
    torch.save(state, tmp_path / 'deit.pth')
    model = DeiT(arch, init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'deit.pth')))
    model.init_weights()
    table = state['pos_embed'][0, 1:].double().reshape(grid, grid, -1)
    m = antialiased_bicubic_matrix(grid, 14)
    expected = torch.einsum('ih,hwc,jw->ijc', m, table, m).flatten(0, 1)
    torch.testing.assert_close(model.pos_embed[0, 1:].double(), expected, rtol=0, atol=1e-5)
    assert torch.equal(model.pos_embed[0, 0], state['pos_embed'][0, 0])
    assert torch.equal(model.blocks[0].attn.qkv.weight, state['blocks.0.attn.qkv.weight'])


def test_a_position_table_that_is_not_a_class_slot_plus_a_square_is_rejected():
    from mmwf.models.layers import resample_pos_embed
    with pytest.raises(ValueError, match=r'shape \(1, 13, 8\) is not a class slot plus a square grid'):
        resample_pos_embed(torch.zeros(1, 13, 8), 4)


def test_graph_exported_at_the_pretraining_grid_serves_other_grids():
    """At its pretraining grid the table is used as it is, but an exported graph resamples for every size: one
    exported there gives eager's outputs on other grids."""
    from torch.export import Dim, export
    model = DeiT(dict(embed_dims=32, depth=1, num_heads=2, mlp_ratio=2), pretrain_size=16 * 6).eval()
    with torch.no_grad():
        model.pos_embed.normal_()
    assert torch.equal(model.patch_pos_embed((6, 6)), model.pos_embed[:, 1:])
    dims = {'x': {0: Dim('batch', min=1, max=8), 2: 16 * Dim('h', min=2, max=32), 3: 16 * Dim('w', min=2, max=32)}}
    program = export(model, (torch.randn(2, 3, 16 * 6, 16 * 6),), dynamic_shapes=dims).module()
    for shape in ((1, 3, 16 * 6, 16 * 6), (3, 3, 16 * 5, 16 * 9)):
        x = torch.randn(*shape)
        with torch.no_grad():
            torch.testing.assert_close(program(x)[0], model(x)[0], rtol=1e-5, atol=1e-5)


def test_layer_scale_starts_at_one_from_a_plain_checkpoint_and_scales_the_branches(tmp_path):
    """ViT-Adapter's plain ViT: gamma1 / gamma2 per block, absent from DeiT checkpoints (loaded as 1, the identical
    network); with both at 0 every block is the identity."""
    arch = dict(embed_dims=32, depth=2, num_heads=2, mlp_ratio=2)
    plain = DeiT(arch, with_cls_token=False).eval()
    torch.save(plain.state_dict(), tmp_path / 'deit.pth')
    scaled = DeiT(arch, with_cls_token=False, layer_scale=True,
                  init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'deit.pth'))).eval()
    scaled.init_weights()
    img = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        assert torch.allclose(scaled(img)[0], plain(img)[0], atol=1e-6)
        for block in scaled.blocks:
            block.gamma1.zero_()
            block.gamma2.zero_()
        tokens = scaled.patch_embed(img).flatten(2).transpose(1, 2) + scaled.patch_pos_embed((4, 6))
        assert torch.allclose(scaled(img)[0], scaled.norm(tokens).transpose(1, 2).unflatten(2, (4, 6)), atol=1e-6)
