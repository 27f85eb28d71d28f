"""Softmax DeiT -> linear-attention DeiT transfer: each recipe copies exactly its tensors, bit for bit."""
import pytest
import torch

from mmwf.models.backbones import DeiT
from mmwf.models.layers import OPERATORS
from mmwf.models.transfer import transfer_softmax_weights
from mmwf.registry import MODELS

ARCH = dict(embed_dims=48, depth=2, num_heads=3, mlp_ratio=2)
LINEAR = [c.__name__ for n, c in OPERATORS.items() if n != 'softmax']


def student(op, **kwargs):
    return DeiT(ARCH, pretrain_size=64, attn_cfg=dict(type=op), with_cls_token=MODELS.get(op).with_cls_token,
                num_classes=10, **kwargs)


@pytest.fixture
def teacher_file(tmp_path):
    teacher = DeiT(ARCH, pretrain_size=64, num_classes=10)
    state = {k: v + torch.randn_like(v) for k, v in teacher.state_dict().items()}  # no tensor equals an init
    path = tmp_path / 'deit.pth'
    torch.save({'model': state}, path)
    return str(path), state


def expected(recipe, op, names):
    attn = [n for n in names if '.attn.qkv.' in n or '.attn.proj.' in n]
    if recipe == 'copy':
        return {n for n in attn if not (op == 'TTTAttention' and ('.qkv.' in n or '.proj.' in n))}
    if recipe == 'mlp_copy':
        return {n for n in names if '.mlp.' in n}
    shared = {n for n in names if not ('.attn.' in n and n not in attn)}
    if op == 'TTTAttention':
        shared -= {n for n in attn}
    return shared


@pytest.mark.parametrize('recipe', ['copy', 'mlp_copy', 'full_copy'])
@pytest.mark.parametrize('op', LINEAR)
def test_each_recipe_copies_exactly_its_tensors(teacher_file, recipe, op):
    path, source = teacher_file
    model = student(op, init_cfg=dict(type='SoftmaxTransfer', checkpoint=path, recipe=recipe))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.init_weights()
    after = model.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    copied = {k for k in after if k in source and after[k].shape == source[k].shape
              and torch.equal(after[k], source[k])}
    want = expected(recipe, op, list(after))
    assert copied == want
    if op == 'TTTAttention' and recipe in ('copy', 'full_copy'):
        for i in range(ARCH['depth']):
            for part in ('weight', 'bias'):
                name = f'blocks.{i}.attn.qkv.{part}'
                assert torch.equal(after[name][:144], source[name])
                assert torch.equal(after[name][144:], before[name][144:])
                want = want | {name}
        assert changed == want
    else:
        assert changed <= want
    assert changed
    assert 'cls_token' not in after or recipe != 'full_copy' or 'cls_token' in copied


def test_copy_without_proj_and_report(teacher_file):
    path, _ = teacher_file
    model = student('ReLUAttention')
    report = transfer_softmax_weights(model, path, 'copy', copy_proj=False)
    assert sorted(report['copied']) == sorted(f'blocks.{i}.attn.qkv.{p}' for i in range(2) for p in ('weight', 'bias'))
    assert 'blocks.0.attn.proj.weight' in report['skipped']
    assert any(k.startswith('blocks.0.attn.proj.weight (not in copy)') for k in report['kept'])


def test_position_table_of_another_grid_is_resampled(tmp_path):
    teacher = DeiT(ARCH, pretrain_size=112)
    torch.save(teacher.state_dict(), tmp_path / 'deit112.pth')
    model = student('MHLAttention')
    report = transfer_softmax_weights(model, str(tmp_path / 'deit112.pth'), 'full_copy')
    assert report['resampled'] == ['pos_embed (49 -> 16 patch positions)']
    from timm.layers import resample_abs_pos_embed  # the reference: timm's checkpoint conversion
    expected = resample_abs_pos_embed(teacher.pos_embed.detach(), new_size=(4, 4), num_prefix_tokens=1)
    assert torch.allclose(model.pos_embed, expected, atol=1e-6)
    assert 'cls_token' in report['skipped']


def test_wrong_checkpoints_are_clear_errors(tmp_path):
    from mmwf.models.backbones import WeightFormer
    torch.save(WeightFormer(dict(embed_dims=48, depth=2, mlp_ratio=2)).state_dict(), tmp_path / 'wf.pth')
    with pytest.raises(ValueError, match=r'not a softmax DeiT.*blocks\.0\.attn\.qkv\.weight.*DeiT does not'):
        transfer_softmax_weights(student('ELUAttention'), str(tmp_path / 'wf.pth'), 'copy')
    with pytest.raises(FileNotFoundError, match='Official DeiT weights'):
        transfer_softmax_weights(student('ELUAttention'), str(tmp_path / 'nope.pth'), 'copy')
    with pytest.raises(ValueError, match='unknown transfer recipe'):
        transfer_softmax_weights(student('ELUAttention'), str(tmp_path / 'wf.pth'), 'fullcopy')


def test_operators_without_class_token_refuse_one():
    with pytest.raises(ValueError, match='with_cls_token=False'):
        DeiT(ARCH, attn_cfg=dict(type='TTTAttention'), with_cls_token=True)
    assert not DeiT(ARCH, attn_cfg=dict(type='TTTAttention')).with_cls_token  # by default, the operator's
    model = student('TTTAttention')
    assert model.forward_classifier(torch.randn(2, 3, 64, 80)).shape == (2, 10)
    assert [f.shape for f in model(torch.randn(2, 3, 64, 80))] == [(2, 48, 4, 5)]
