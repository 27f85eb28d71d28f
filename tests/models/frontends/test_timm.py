"""WeightFormer and the study's DeiTs as timm models: the registered names, timm's model API, and timm's own
pretrained path (a file, a whole-model checkpoint, the Hugging Face hub cache)."""
import inspect
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from mmengine.config import Config
from mmengine.logging import MessageHub, MMLogger
from safetensors.torch import save_file
from timm.optim import param_groups_layer_decay

import mmwf  # noqa: F401
from mmwf.configs import metafile_models
from mmwf.models.backbones import DeiT, WeightFormer, deit_study
from mmwf.models.backbones import weightformer as wf_module
from mmwf.utils.checkpoint import CheckpointMismatchError, plain_checkpoint
from tests.hub_cache import offline_hub_repo
from tests.tolerance import assert_same_computation

TINY_WF = dict(embed_dims=32, depth=4, mlp_ratio=2)
TINY_DEIT = dict(embed_dims=32, depth=3, num_heads=2, mlp_ratio=2)
IMAGENET_CONFIGS = sorted(Path(__file__).parents[3].glob('configs/imagenet/*_in1k.py'))
# the arguments of a config's backbone that are its training recipe or its mmpretrain wiring, not the architecture
RECIPE_KEYS = {'type', 'drop_path_rate', 'num_classes', 'out_type', 'init_cfg'}


def timm_name(config: Path) -> str:
    """The timm name of an ImageNet config: its file name without ``_in1k``, ``-`` as ``_``."""
    return config.stem.removesuffix('_in1k').replace('-', '_')


def test_every_registered_name_is_new_to_timm_and_listed():
    names = [*wf_module.TIMM_VARIANTS, *deit_study.TIMM_VARIANTS]
    assert len(names) == 22 + 18
    assert sorted(timm.list_models(['weightformer*', 'deit_[tsb]_*'])) == sorted(names)
    for name in names:  # each resolves to our entry point in our module
        assert timm.models.model_entrypoint(name).__module__ in (wf_module.__name__, deit_study.__name__)
    # timm files them under modules of their own, not under its deit
    assert sorted(timm.list_models(module=['weightformer', 'deit_study'])) == sorted(names)
    assert not set(timm.list_models(module='deit')) & set(names)
    # the released models carry the release's hub weights, those the model index links; the others are untrained
    assert sorted(timm.list_pretrained(['weightformer*', 'deit_[tsb]_*'])) == [
        'deit_b_softmax.fb_in1k', 'deit_s_softmax.fb_in1k', 'deit_t_softmax.fb_in1k',
        'weightformer_b.in1k', 'weightformer_s.in1k', 'weightformer_t.in1k']
    linked = {name: model['Weights'] for name, model in metafile_models().items() if 'Weights' in model}
    assert {f'weightformer_{size}_in1k' for size in 'tsb'} == set(linked)
    for size in 'tsb':
        hub_id = timm.models.get_pretrained_cfg(f'weightformer_{size}.in1k').hf_hub_id
        assert linked[f'weightformer_{size}_in1k'] == f'https://huggingface.co/{hub_id}/resolve/main/model.safetensors'


@pytest.mark.parametrize('config', IMAGENET_CONFIGS, ids=lambda c: c.stem)
def test_each_imagenet_config_is_the_timm_model_of_its_name(config):
    """The timm entry point builds what the config's backbone builds (same arguments, recipe aside)."""
    backbone = Config.fromfile(str(config)).model.backbone.to_dict()
    family = {'WeightFormer': wf_module, 'DeiT': deit_study}[backbone['type']]
    cls = {'WeightFormer': WeightFormer, 'DeiT': DeiT}[backbone['type']]
    defaults = {name: p.default for name, p in inspect.signature(cls).parameters.items()}
    arch = {k: v for k, v in backbone.items() if k not in RECIPE_KEYS}
    assert {**defaults, **family.TIMM_VARIANTS[timm_name(config)]} == {**defaults, **arch}


def test_evaluation_settings_are_the_configs():
    """pretrained_cfg's mean, std and crop are what the ImageNet configs test with."""
    cfg = Config.fromfile(str(IMAGENET_CONFIGS[0].parent / 'weightformer_b_in1k.py'))
    resize, crop = (t for t in cfg.test_pipeline if t['type'] in ('Resize', 'CenterCrop'))
    for name in ('weightformer_t', 'weightformer_b', 'deit_s_mhla'):
        pcfg = timm.models.get_pretrained_cfg(name)
        assert [round(m * 255, 3) for m in pcfg.mean] == cfg.data_preprocessor['mean']
        assert [round(s * 255, 3) for s in pcfg.std] == cfg.data_preprocessor['std']
        assert (pcfg.crop_mode, pcfg.interpolation, pcfg.crop_pct) == ('squash', 'bicubic', 224 / 256)
    assert timm.models.get_pretrained_cfg('weightformer_b').input_size == (3, crop['crop_size'], crop['crop_size'])
    assert resize['scale'] == (512, 512) and 448 / 512 == 224 / 256


def test_timm_model_is_the_classifier():
    """create_model builds the same module as the OpenMMLab classifier: same keys, same logits."""
    ours = WeightFormer('t', num_classes=1000, out_type='logits').eval()
    model = timm.create_model('weightformer_t').eval()
    assert type(model) is WeightFormer and model.state_dict().keys() == ours.state_dict().keys()
    model.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        assert_same_computation(model(x), ours(x)[0])
    with pytest.raises(TypeError, match='not_an_argument'):
        timm.create_model('weightformer_t', not_an_argument=1)


def test_weightformer_features_head_and_reset():
    """forward_features is the (B, H, W, C) map; forward_head averages it (pre_logits) and applies the head;
    reset_classifier(0) and (0, '') give the pooled and the unpooled features, as timm's Swin."""
    model = timm.create_model('weightformer_t', num_classes=7).eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, 4, 6, 192)
        pooled = model.forward_head(feats, pre_logits=True)
        torch.testing.assert_close(pooled, feats.mean((1, 2)))
        torch.testing.assert_close(model(x), pooled @ model.head.weight.T + model.head.bias)
        model.reset_classifier(0)
        torch.testing.assert_close(model(x), pooled)
        model.reset_classifier(0, '')
        torch.testing.assert_close(model(x), feats)
    with pytest.raises(ValueError, match="global_pool must be one of \\('avg',\\)"):
        model.reset_classifier(3, 'token')


def test_deit_is_timms_vision_transformer():
    """Our DeiT under timm's API against timm's own VisionTransformer with the same weights: features, pooled
    features (class token and mean), logits and intermediates."""
    from timm.models.vision_transformer import VisionTransformer
    ours = DeiT(TINY_DEIT, num_classes=5, out_type='timm', pretrain_size=64).eval()
    ref = VisionTransformer(img_size=64, embed_dim=32, depth=3, num_heads=2, mlp_ratio=2, num_classes=5,
                            qkv_bias=True).eval()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x))
        torch.testing.assert_close(ours(x), ref(x))
        for norm in (False, True):
            mine = ours.forward_intermediates(x, indices=[0, 2], norm=norm, intermediates_only=True)
            theirs = ref.forward_intermediates(x, indices=[0, 2], norm=norm, intermediates_only=True)
            for a, b in zip(mine, theirs, strict=True):
                torch.testing.assert_close(a, b)
        ours.reset_classifier(0, 'avg')
        ref.reset_classifier(0, 'avg')
        torch.testing.assert_close(ours(x), ref(x))


@pytest.mark.parametrize('kwargs', [dict(with_cls_token=False), dict(window_size=2, window_block_indexes=(0, 2)),
                                    dict(attn_cfg=dict(type='MHLAttention'))],
                         ids=['no-class-token', 'windows', 'mhla'])
def test_dense_deit_without_class_token_gives_its_maps(kwargs):
    """The dense DeiTs of the detection and segmentation configs have no class token: forward_features and
    forward_intermediates run them as the OpenMMLab forward does."""
    dense = DeiT(TINY_DEIT, out_indices=(0, 1, 2), final_norm=False, pretrain_size=64, **kwargs).eval()
    assert not hasattr(dense, 'cls_token') and dense.pools() == ('avg',)
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        for got, want in zip(dense.forward_intermediates(x, intermediates_only=True), dense(x), strict=True):
            torch.testing.assert_close(got, want)
        assert dense.forward_features(x).shape == (2, 12, 32)


def test_pruning_keeps_the_kept_blocks_outputs_and_the_saved_config(tmp_path):
    """prune_intermediate_layers keeps what the kept blocks returned (no final norm moved onto the new last block),
    keeps out_indices within the blocks, and save_pretrained records the pruned network."""
    model = WeightFormer(TINY_WF, out_indices=(1, 2, 3), dynamic_blocks=[0, -2, 3]).eval()  # -2: block 2
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        before = model(x)[:2]
        assert model.prune_intermediate_layers([1, 2], prune_head=False) == [1, 2]
        assert model.out_indices == [1, 2] and len(model.blocks) == 3
        for got, want in zip(model(x), before, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    model.save_pretrained(tmp_path / 'pruned')
    again = WeightFormer.from_pretrained(tmp_path / 'pruned')
    assert len(again.blocks) == 3 and again.out_indices == [1, 2] and again.dynamic_ids == {0, 2}
    with torch.no_grad():
        for got, want in zip(again(x), before, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_intermediates_and_features_only_are_the_dense_backbones_maps():
    """forward_intermediates and features_only=True give the block outputs the OpenMMLab backbone returns for the
    same out_indices; the final output of forward_intermediates is forward_features."""
    dense = WeightFormer(TINY_WF, out_indices=(1, 2), final_norm=False, dynamic_blocks=[0, 2]).eval()
    model = WeightFormer(TINY_WF, out_type='timm', num_classes=3, dynamic_blocks=[0, 2]).eval()
    model.load_state_dict(dense.state_dict(), strict=False)  # the head is the timm model's alone
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        expected = dense(x)
        final, maps = model.forward_intermediates(x, indices=[1, 2])
        for got, want in zip(maps, expected, strict=True):
            torch.testing.assert_close(got, want)
        torch.testing.assert_close(final, model.forward_features(x))
        nhwc = model.forward_intermediates(x, indices=[1], output_fmt='NHWC', intermediates_only=True)
        torch.testing.assert_close(nhwc[0].permute(0, 3, 1, 2), expected[0])
        feats = timm.create_model('weightformer_t', features_only=True, out_indices=(1, 4)).eval()
        assert len(feats.model.blocks) == 5 and feats.feature_info.channels() == [192, 192]
        full = WeightFormer('t', out_indices=(1, 4)).eval()
        full.load_state_dict(feats.model.state_dict(), strict=False)
        for got, want in zip(feats(x), full(x), strict=True):
            torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match='cannot take the last 5'):
        model.forward_intermediates(x, indices=5)


def test_layer_decay_groups_and_no_weight_decay():
    """timm's layer-wise lr decay puts the stem first, each block after it (the final norm with the last), the head
    last, as for timm's ViT; the position table and class token are not decayed."""
    model = timm.create_model('deit_t_relu', arch=dict(embed_dims=64, depth=3, num_heads=2, mlp_ratio=2))
    groups = param_groups_layer_decay(model, weight_decay=0.05, no_weight_decay_list=model.no_weight_decay(),
                                      layer_decay=0.5)  # as timm's optimizer factory calls it
    name_of = {id(p): name for name, p in model.named_parameters()}
    scale = {name_of[id(p)]: g['lr_scale'] for g in groups for p in g['params']}
    decay = {name_of[id(p)]: g['weight_decay'] for g in groups for p in g['params']}

    def layer(name: str) -> int:
        if name.startswith(('patch_embed', 'pos_embed', 'cls_token')):
            return 0
        block = re.match(r'blocks\.(\d+)\.', name)
        return int(block.group(1)) + 1 if block else 3 if name.startswith('norm') else 4
    assert scale == {name: 0.5 ** (4 - layer(name)) for name, _ in model.named_parameters()}
    assert decay['pos_embed'] == decay['cls_token'] == decay['norm.weight'] == 0
    assert decay['blocks.0.attn.qkv.weight'] == 0.05
    wf = timm.create_model('weightformer_t')
    assert wf.no_weight_decay() == set() and re.match(wf.group_matcher()['stem'], 'init_norm.weight')


@pytest.mark.slow
def test_pretrained_from_a_file_a_whole_model_checkpoint_and_the_hub_cache(tmp_path, monkeypatch):
    """timm's pretrained=True: the release's safetensors as a file and from a Hugging Face hub cache laid out as
    huggingface_hub lays it out (offline), and an mmpretrain checkpoint of our classifier; a new head or new input
    channels as timm adapts them."""
    released = WeightFormer('t', num_classes=1000).state_dict()
    safe = tmp_path / 'model.safetensors'
    save_file({k: v.contiguous() for k, v in released.items()}, str(safe))

    def assert_loaded(model: torch.nn.Module, skip: tuple = ()) -> None:
        state = model.state_dict()
        assert state.keys() == released.keys()
        for key, value in released.items():
            if not key.startswith(skip):
                torch.testing.assert_close(state[key], value, rtol=0, atol=0)

    assert_loaded(timm.create_model('weightformer_t', pretrained=True, pretrained_cfg_overlay=dict(file=str(safe))))
    whole = tmp_path / 'epoch_300.pth'  # as an mmwf run writes it (SafeCheckpointHook: the message hub as plain data)
    hub = MessageHub('run')
    hub.update_scalar('train/loss', np.float32(0.5))
    hub.update_info('iter', 300)
    checkpoint = dict(meta=dict(epoch=300, seed=np.int64(0)), message_hub=hub.state_dict(),
                      state_dict={f'backbone.{k}': v for k, v in released.items()})
    plain_checkpoint(checkpoint)
    torch.save(checkpoint, whole)
    assert_loaded(timm.create_model('weightformer_t', pretrained=True, pretrained_cfg_overlay=dict(file=str(whole))))

    offline_hub_repo(tmp_path / 'hub', 'RuizeHe/weightformer-t', {'model.safetensors': safe.read_bytes()}, monkeypatch)
    assert_loaded(timm.create_model('weightformer_t', pretrained=True))
    ten = timm.create_model('weightformer_t', pretrained=True, num_classes=10)
    assert ten.head.out_features == 10
    gray = timm.create_model('weightformer_t', pretrained=True, in_chans=1)
    torch.testing.assert_close(gray.patch_embed.proj.weight, released['patch_embed.proj.weight'].sum(1, keepdim=True))

    other = tmp_path / 'small.safetensors'
    save_file(WeightFormer('s', num_classes=1000).state_dict(), str(other))
    with pytest.raises(CheckpointMismatchError, match=r'shape mismatches \(197\): blocks.0.dwc.bias: checkpoint '
                                                      r'\(384,\) vs model \(192,\)'):
        timm.create_model('weightformer_t', pretrained=True, pretrained_cfg_overlay=dict(file=str(other)))


def test_pretrained_weights_of_another_family_are_refused_even_with_a_new_head(tmp_path):
    """timm's own rule loads 36 of WF-T's 198 tensors from a DeiT-T file when the class count differs ("may be
    expected if model is being adapted"); mmwf's leaves out only the classifier, and pretrained_strict=False is the
    explicit opt-out, logged."""
    deit = tmp_path / 'deit.safetensors'
    save_file(DeiT('t', num_classes=1000).state_dict(), str(deit))
    overlay = dict(file=str(deit))
    with pytest.raises(CheckpointMismatchError, match=rf'\(file {re.escape(str(deit))}\) do not match WeightFormer.*'
                                                      r'\nmissing keys \(160, under blocks'):
        timm.create_model('weightformer_t', pretrained=True, num_classes=10, pretrained_cfg_overlay=overlay)
    logger, records = MMLogger.get_current_instance(), []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger.addHandler(handler)
    try:
        model = timm.create_model('weightformer_t', pretrained=True, num_classes=10, pretrained_cfg_overlay=overlay,
                                  pretrained_strict=False)
    finally:
        logger.removeHandler(handler)
    out = '\n'.join(records)
    assert model.head.out_features == 10
    assert 'pretrained_strict=False: timm pretrained weights loaded where they fit' in out
    assert 'the classifier (head.bias, head.weight) left out for num_classes=10' in out


def test_new_head_and_pooling_survive_save_pretrained(tmp_path):
    """reset_classifier and timm's global_pool are what from_pretrained builds again."""
    model = timm.create_model('deit_t_relu', arch=dict(embed_dims=32, depth=2, num_heads=2, mlp_ratio=2),
                              global_pool='avg').eval()
    model.reset_classifier(10)
    model.save_pretrained(tmp_path / 'repo')
    again = DeiT.from_pretrained(tmp_path / 'repo')
    assert (again.global_pool, again.num_classes, again.out_type) == ('avg', 10, 'timm')
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert_same_computation(again(x), model(x))


def test_the_guides_timm_block_runs_as_printed(tmp_path, monkeypatch):
    """docs/guides/frontends.md's timm block, executed whole as printed in a folder with a run's epoch_300.pth and an
    offline hub cache holding the release's weights: each line gives what its comment says."""
    from tests.test_docs import block
    released = WeightFormer('t', num_classes=1000).state_dict()
    safe = tmp_path / 'model.safetensors'
    save_file({k: v.contiguous() for k, v in released.items()}, str(safe))
    offline_hub_repo(tmp_path / 'hub', 'RuizeHe/weightformer-t', {'model.safetensors': safe.read_bytes()}, monkeypatch)
    ours = {k: v + 1 for k, v in released.items()}  # a run of ours: other weights than the release's
    checkpoint = dict(meta=dict(epoch=300), state_dict={f'backbone.{k}': v for k, v in ours.items()})
    plain_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / 'epoch_300.pth')
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(block('guides/frontends.md', 'import mmwf, timm'), 'frontends.md', 'exec'), namespace)
    for name, expected in (('model', released), ('local', ours)):
        state = namespace[name].state_dict()
        assert all(torch.equal(state[k], v) for k, v in expected.items()), name
    maps = namespace['feats'](torch.randn(1, 3, 64, 96))
    assert [tuple(m.shape) for m in maps] == [(1, 384, 4, 6)] * 4
    cfg = namespace['cfg']
    assert (cfg['interpolation'], cfg['crop_mode'], cfg['input_size']) == ('bicubic', 'squash', (3, 224, 224))
