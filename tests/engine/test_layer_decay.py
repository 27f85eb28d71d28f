from importlib import import_module

import pytest
import torch.nn as nn
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

import mmwf  # noqa: F401
from mmwf.models.backbones import DeiT, WeightFormer
from mmwf.models.necks import SimpleFeaturePyramid


class Detector(nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.neck = SimpleFeaturePyramid(32, 16)


def build(model, scope='mmdet', decay=0.7, layers=5, **paramwise):
    import_module(f'{scope}.registry')
    init_default_scope(scope)  # lookups now start in the project's child registries
    cfg = dict(type='OptimWrapper', constructor='LayerDecayOptimWrapperConstructor',
               optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.1),
               paramwise_cfg=dict(num_layers=layers, decay_rate=decay, **paramwise))
    return build_optim_wrapper(model, cfg).optimizer


def lookup(optimizer, model):
    ids = {id(p): n for n, p in model.named_parameters()}
    return {ids[id(p)]: (g['lr'], g['weight_decay']) for g in optimizer.param_groups for p in g['params']}


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_weightformer_layer_ids(scope):
    model = Detector(WeightFormer(dict(embed_dims=32, depth=5, mlp_ratio=2)))
    groups = lookup(build(model, scope), model)
    assert groups['backbone.patch_embed.proj.weight'] == (pytest.approx(0.7 ** 6), 0.1)
    assert groups['backbone.init_norm.weight'] == (pytest.approx(0.7 ** 6), 0.0)
    assert groups['backbone.blocks.0.linear1.weight'] == (pytest.approx(0.7 ** 5), 0.1)
    assert groups['backbone.blocks.1.linear1.w'] == (pytest.approx(0.7 ** 4), 0.1)
    assert groups['backbone.blocks.1.norm1.weight'] == (pytest.approx(0.7 ** 4), 0.0)
    assert groups['backbone.blocks.4.linear2.bias'] == (pytest.approx(0.7), 0.1)
    assert groups['backbone.norm.weight'] == (pytest.approx(1.0), 0.0)
    assert groups['neck.stages.0.0.weight'] == (pytest.approx(1.0), 0.1)
    assert groups['neck.stages.0.1.weight'] == (pytest.approx(1.0), 0.0)  # LayerNorm2d
    assert len(groups) == sum(1 for _ in model.parameters())


def test_deit_position_embedding_has_no_weight_decay():
    model = Detector(DeiT(dict(embed_dims=32, depth=3, num_heads=2, mlp_ratio=2)))
    groups = lookup(build(model, 'mmseg', decay=0.9, layers=3), model)
    assert groups['backbone.pos_embed'] == (pytest.approx(0.9 ** 4), 0.0)
    assert groups['backbone.cls_token'] == (pytest.approx(0.9 ** 4), 0.0)
    assert groups['backbone.blocks.2.attn.qkv.weight'] == (pytest.approx(0.9), 0.1)


def test_num_layers_defaults_to_the_backbone_and_a_wrong_count_is_refused():
    model = Detector(WeightFormer(dict(embed_dims=32, depth=4, mlp_ratio=2)))
    init_default_scope('mmdet')
    cfg = dict(constructor='LayerDecayOptimWrapperConstructor', optimizer=dict(type='AdamW', lr=1.0),
               paramwise_cfg=dict(decay_rate=0.5))
    groups = lookup(build_optim_wrapper(model, cfg).optimizer, model)
    assert groups['backbone.patch_embed.proj.weight'][0] == pytest.approx(0.5 ** 5)  # num_layers = 4 blocks
    with pytest.raises(ValueError, match=r'num_layers=2 but the backbone \(WeightFormer\) has 4 blocks: the last '
                                         r'2 blocks would train at up to 2x the base lr. Set num_layers=4 or leave'):
        build(model, layers=2, decay=0.5)
    with pytest.raises(ValueError, match='num_layers=6 .* 2 extra decay steps'):
        build(model, layers=6)
    with pytest.raises(ValueError, match=r"keys \['layer_decay_rate'\] are not implemented.*num_layers, decay_rate"):
        build(model, layers=4, layer_decay_rate=0.9)
    with pytest.raises(ValueError, match=r'decay_rate must be a number in \(0, 1\]'):
        build(model, layers=4, decay=1.5)


def test_distilled_student_keeps_its_layer_ids_and_frozen_teacher_is_left_out():
    """Under AttentionDistiller the names gain a ``student.`` prefix; the frozen teacher has no group."""
    wrapper = nn.Module()
    wrapper.student = Detector(DeiT(dict(embed_dims=32, depth=3, num_heads=2, mlp_ratio=2)))
    wrapper.teacher = DeiT(dict(embed_dims=32, depth=3, num_heads=2, mlp_ratio=2)).requires_grad_(False)
    groups = lookup(build(wrapper, 'mmdet', decay=0.9, layers=3), wrapper)
    assert groups['student.backbone.blocks.0.attn.qkv.weight'] == (pytest.approx(0.9 ** 3), 0.1)
    assert groups['student.neck.stages.0.0.weight'] == (pytest.approx(1.0), 0.1)
    assert not [n for n in groups if n.startswith('teacher.')]


def deit_detector():
    return Detector(DeiT(dict(embed_dims=32, depth=3, num_heads=2, mlp_ratio=2)))


def test_vitdet_rule_exempts_the_backbone_norms_and_pos_embed_only():
    """detectron2: torch norm layers (only the backbone's in ViTDet) and pos_embed; LayerNorm2d and biases decayed."""
    model = deit_detector()
    groups = lookup(build(model, layers=3, no_decay='vitdet'), model)
    no_wd = {n for n, (_, wd) in groups.items() if wd == 0.0}
    assert no_wd == {n for n in groups if n.startswith('backbone.') and '.norm' in n} | {'backbone.pos_embed'}
    assert groups['backbone.blocks.0.attn.qkv.bias'][1] == 0.1
    assert groups['neck.stages.0.1.weight'][1] == 0.1  # LayerNorm2d of the pyramid


def test_beit_rule_exempts_every_1d_parameter_and_bias():
    """BEiT / Vim segmentation: 1-D tensors and biases, wherever they are; pos_embed is decayed (3-D)."""
    model = deit_detector()
    groups = lookup(build(model, 'mmseg', decay=0.9, layers=3, no_decay='beit'), model)
    for name in ('backbone.blocks.0.norm1.weight', 'backbone.blocks.0.attn.qkv.bias', 'backbone.norm.bias',
                 'neck.stages.0.1.weight', 'neck.stages.0.0.bias'):
        assert groups[name][1] == 0.0, name
    for name in ('backbone.patch_embed.proj.weight', 'backbone.blocks.2.mlp.fc1.weight', 'backbone.cls_token',
                 'neck.stages.0.0.weight'):
        assert groups[name][1] == 0.1, name
    assert groups['backbone.pos_embed'] == (pytest.approx(0.9 ** 4), 0.1)


def test_unknown_no_decay_rule_is_named():
    with pytest.raises(ValueError, match="no_decay='detectron'.*'beit', 'norms', 'vitdet'"):
        build(deit_detector(), layers=3, no_decay='detectron')


def test_reference_depth_decays_a_deeper_backbone_as_the_reference_depth():
    """Vim's depth-matched rule: with reference_depth=12 a 5-block backbone decays in steps of 0.7 ** (12 / 5) per
    block, so its 5 blocks span the decay that 12 blocks span at 0.7."""
    model = Detector(WeightFormer(dict(embed_dims=32, depth=5, mlp_ratio=2)))
    init_default_scope('mmdet')
    cfg = dict(type='OptimWrapper', constructor='LayerDecayOptimWrapperConstructor',
               optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.1),
               paramwise_cfg=dict(decay_rate=0.7, reference_depth=12))
    groups = lookup(build_optim_wrapper(model, cfg).optimizer, model)
    assert groups['backbone.patch_embed.proj.weight'][0] == pytest.approx(0.7 ** (12 * 6 / 5))
    assert groups['backbone.blocks.4.linear2.weight'][0] == pytest.approx(0.7 ** (12 / 5))


def test_frozen_stages_are_left_out_and_the_rest_keep_their_layer_ids():
    model = Detector(WeightFormer(dict(embed_dims=32, depth=4, mlp_ratio=2), frozen_stages=2))
    groups = lookup(build(model, layers=4, decay=0.5), model)
    assert not any(k.startswith(('backbone.patch_embed', 'backbone.blocks.0.', 'backbone.blocks.1.')) for k in groups)
    assert groups['backbone.blocks.2.linear1.weight'][0] == pytest.approx(0.5 ** 2)
    assert groups['backbone.blocks.3.linear1.weight'][0] == pytest.approx(0.5)
