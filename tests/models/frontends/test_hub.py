"""The backbones as Hugging Face hub models: save_pretrained / from_pretrained round trips, the release's hub
repositories read as they are (offline, from a hub cache), and the model index's hub links through the hub's
cache."""
import json

import pytest
import torch
from safetensors.torch import save_file

import mmwf  # noqa: F401
from mmwf.models.backbones import DeiT, WeightFormer
from mmwf.utils.checkpoint import CheckpointMismatchError, load_state_dict_file
from tests.hub_cache import offline_hub_repo
from tests.tolerance import assert_same_computation

TINY_WF = dict(embed_dims=32, depth=4, mlp_ratio=2)

# config.json of the release's RuizeHe/weightformer-s, as its PyTorchModelHubMixin writes the arguments of
# model/hub_models.py's WeightFormer_S
RELEASE_S_CONFIG = dict(img_size=224, patch_size=16, in_chans=3, num_classes=1000, embed_dim=384, depth=17,
                        mlp_ratio=4.0, qkv_bias=True, representation_size=None, distilled=False, drop_rate=0.0,
                        attn_drop_rate=0.0, drop_path_rate=0.0)


@pytest.mark.parametrize('build', [
    lambda: WeightFormer(TINY_WF, dynamic_blocks=[1], dynamic_linear=dict(type='GAPDynamicLinear'), num_classes=3,
                         out_type='logits', ffn_type='swiglu'),
    lambda: DeiT(dict(embed_dims=32, depth=2, num_heads=2, mlp_ratio=2), attn_cfg=dict(type='MHLAttention'),
                 out_indices=(0, 1), norm_cfg=dict(type='RMSNorm'))], ids=['weightformer', 'deit'])
def test_save_pretrained_round_trip(build, tmp_path):
    """The model back from its folder: the same network and weights; a classifier saved in mmpretrain's form
    (a 1-tuple from forward) comes back giving its logits, as the hub's users expect; the model card says how to load
    it and what it returns."""
    model = build().eval()
    model.save_pretrained(tmp_path / 'repo')
    config = json.loads((tmp_path / 'repo' / 'config.json').read_text())
    assert config['arch'] == model.arch
    again = type(model).from_pretrained(tmp_path / 'repo')
    assert not again.training and repr(again) == repr(model)
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        ours, theirs = model(x), again(x)
    if model.num_classes:
        assert model.out_type == 'logits' and again.out_type == 'timm' and theirs.shape == (2, model.num_classes)
        ours, theirs = ours, (theirs,)
    for a, b in zip(ours, theirs, strict=True):
        assert_same_computation(b, a)
    card = (tmp_path / 'repo' / 'README.md').read_text()
    name = type(model).__name__
    assert f'from mmwf.models.backbones import {name}' in card and f"{name}.from_pretrained('" in card
    assert ('logits (1, 3)' if model.num_classes else 'the feature maps of out_indices') in card
    assert 'More Information Needed' not in card


@pytest.mark.slow
def test_release_hub_repository_as_it_is(tmp_path, monkeypatch):
    """RuizeHe/weightformer-s's config.json and model.safetensors (release keys) from the hub cache, offline: the
    classifier the release builds (logits from forward), or the dense backbone when asked."""
    released = WeightFormer('s', num_classes=1000).state_dict()
    weights = tmp_path / 'w.safetensors'
    save_file(released, str(weights))
    offline_hub_repo(tmp_path / 'hub', 'RuizeHe/weightformer-s',
                     {'config.json': json.dumps(RELEASE_S_CONFIG).encode(), 'model.safetensors': weights.read_bytes()},
                     monkeypatch)
    model = WeightFormer.from_pretrained('RuizeHe/weightformer-s')
    assert model.out_type == 'timm' and model.arch == dict(embed_dims=384, depth=17, mlp_ratio=4.0)
    for key, value in released.items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
    dense = WeightFormer.from_pretrained('RuizeHe/weightformer-s', num_classes=0, out_type='featmap',
                                         out_indices=(5, 16))
    assert [tuple(f.shape) for f in dense(torch.randn(1, 3, 64, 64))] == [(1, 384, 4, 4)] * 2
    torch.testing.assert_close(dense.blocks[3].linear1.weight, released['blocks.3.linear1.weight'])

    # the model index links the same file: our checkpoint reader finds it in the hub cache
    link = 'https://huggingface.co/RuizeHe/weightformer-s/resolve/main/model.safetensors'
    assert load_state_dict_file(link).keys() == released.keys()
    with pytest.raises(FileNotFoundError, match='from the Hugging Face hub'):
        load_state_dict_file('https://huggingface.co/RuizeHe/weightformer-t/resolve/main/model.safetensors')


def test_hub_errors_name_what_does_not_fit(tmp_path, monkeypatch):
    save_file(WeightFormer('t', num_classes=1000).state_dict(), str(tmp_path / 'w.safetensors'))
    offline_hub_repo(tmp_path / 'hub', 'someone/weightformer-t-wrong-config',
                     {'config.json': json.dumps(RELEASE_S_CONFIG).encode(),
                      'model.safetensors': (tmp_path / 'w.safetensors').read_bytes()}, monkeypatch)
    with pytest.raises(CheckpointMismatchError, match='does not match WeightFormer'):
        WeightFormer.from_pretrained('someone/weightformer-t-wrong-config')
    with pytest.raises(ValueError, match="config.json has keys \\['attn_drop_rate', 'depth'"):
        DeiT.from_pretrained('someone/weightformer-t-wrong-config')
