"""mmwf's classifiers in mmpretrain's model hub: names, get_model with the released weights (from an offline hub
cache), and mmpretrain's inferencer on images, against the model computed here by hand."""
import mmpretrain
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

import mmwf  # noqa: F401
from mmwf.models.backbones import WeightFormer
from tests.hub_cache import offline_hub_repo


@pytest.fixture
def hub_names(monkeypatch) -> list[str]:
    """mmwf's classifiers registered with mmpretrain's ModelHub for this test only: the hub's table (and whether it
    holds mmpretrain's own models) and mmengine's checkpoint schemes are restored afterwards."""
    from mmengine.runner import CheckpointLoader
    from mmpretrain.apis import ModelHub
    monkeypatch.setattr(CheckpointLoader, '_schemes', dict(CheckpointLoader._schemes))
    monkeypatch.setattr(ModelHub, '_models_dict', dict(ModelHub._models_dict))
    monkeypatch.setattr(ModelHub, '_ModelHub__mmpretrain_registered', ModelHub._ModelHub__mmpretrain_registered)
    import mmwf.model_hub
    return mmwf.model_hub.register_mmpretrain_models()


@pytest.fixture(scope='module')
def released() -> dict[str, torch.Tensor]:
    """WeightFormer-T weights in the release's layout (its model.safetensors keys)."""
    torch.manual_seed(1)
    return WeightFormer('t', num_classes=1000).state_dict()


def test_registered_names_and_weights_scheme(hub_names):
    from mmengine.runner import CheckpointLoader
    before = dict(CheckpointLoader._schemes)
    import mmwf.model_hub as hub
    names = hub.register_mmpretrain_models()  # again: nothing changes
    assert names == hub_names and 'weightformer_t_in1k' in names and 'deit_s_ttt_in1k' in names
    assert set(mmpretrain.list_models('weightformer*')) == {n for n in names if n.startswith('weightformer')}
    assert {k: v for k, v in CheckpointLoader._schemes.items() if k != 'mmwf://'} == {
        k: v for k, v in before.items() if k != 'mmwf://'}
    assert mmpretrain.apis.ModelHub.get('weightformer_t_in1k').weights == 'mmwf://weightformer_t_in1k'
    assert mmpretrain.apis.ModelHub.get('deit_t_relu_in1k').weights is None


@pytest.mark.slow
def test_get_model_and_inferencer_with_the_released_weights(hub_names, released, tmp_path, monkeypatch):
    weights = tmp_path / 'w.safetensors'
    save_file(released, str(weights))
    offline_hub_repo(tmp_path / 'hub', 'RuizeHe/weightformer-t', {'model.safetensors': weights.read_bytes()},
                     monkeypatch)
    model = mmpretrain.get_model('weightformer_t_in1k', pretrained=True).eval()
    for key, value in released.items():
        torch.testing.assert_close(model.state_dict()[f'backbone.{key}'], value, rtol=0, atol=0)

    # an image through the release's evaluation, by hand: square bicubic resize to 256, centre crop 224, ImageNet
    # mean / std, the released network
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (300, 260, 3), dtype=np.uint8))
    path = tmp_path / 'image.png'
    image.save(path)
    pixels = np.asarray(image.resize((256, 256), Image.BICUBIC), dtype=np.float32)[16:240, 16:240]
    x = (torch.from_numpy(pixels) - torch.tensor([123.675, 116.28, 103.53])) / torch.tensor([58.395, 57.12, 57.375])
    reference = WeightFormer('t', num_classes=1000, out_type='timm').eval()
    reference.load_state_dict(released)
    with torch.no_grad():
        expected = reference(x.permute(2, 0, 1)[None]).softmax(-1)[0]

    from mmengine.registry import DefaultScope
    from mmpretrain import ImageClassificationInferencer
    # mmpretrain's inferencer builds its pipeline in the current default scope: a runner of another test in this
    # process may have left 'mmengine' current, as in a user's process; mmpretrain's is what a fresh process has
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        result = ImageClassificationInferencer('weightformer_t_in1k', pretrained=True)(str(path))[0]
        again = mmpretrain.inference_model('weightformer_t_in1k', str(path), pretrained=True)
    torch.testing.assert_close(torch.as_tensor(result['pred_scores']), expected, rtol=1e-4, atol=1e-6)
    assert result['pred_label'] == again['pred_label'] == int(expected.argmax())


def test_released_weights_of_another_model_are_refused(hub_names, tmp_path, monkeypatch):
    """mmpretrain's get_model loads leniently (mmengine, strict=False); the mmwf:// scheme checks first."""
    from mmwf.utils.checkpoint import CheckpointMismatchError
    weights = tmp_path / 'w.safetensors'
    save_file(WeightFormer('s', num_classes=1000).state_dict(), str(weights))
    offline_hub_repo(tmp_path / 'hub', 'RuizeHe/weightformer-t', {'model.safetensors': weights.read_bytes()},
                     monkeypatch)
    with pytest.raises(CheckpointMismatchError, match=r"does not match weightformer_t_in1k's backbone:\nshape "
                                                      r'mismatches \(19\d\)'):
        mmpretrain.get_model('weightformer_t_in1k', pretrained=True)


def test_a_weights_file_handed_to_get_model_loads_or_is_refused(hub_names, released, tmp_path):
    """get_model(NAME, pretrained=FILE) loads through mmengine's lenient loader. A classifier checkpoint of the
    model (its backbone. keys) loads as it is; the release's file (the backbone's own keys at the root) would leave
    a random classifier behind a warning, and is refused, naming the load that takes it."""
    classifier = tmp_path / 'classifier.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in released.items()}}, classifier)
    model = mmpretrain.get_model('weightformer_t_in1k', pretrained=str(classifier))
    for key, value in released.items():
        torch.testing.assert_close(model.state_dict()[f'backbone.{key}'], value, rtol=0, atol=0)
    backbone_file = tmp_path / 'model.safetensors'
    save_file(released, str(backbone_file))
    from mmwf.utils import CheckpointMismatchError
    with pytest.raises(CheckpointMismatchError, match=r"(?s)WeightFormer \(the model's 'backbone'\) was given none of "
                                                      r'its 198 tensors.*mmwf\.utils\.load_strict\(model\.backbone'):
        mmpretrain.get_model('weightformer_t_in1k', pretrained=str(backbone_file))
    # the load the error names gives the file's weights
    from mmwf.utils import load_state_dict_file, load_strict
    model = mmpretrain.get_model('weightformer_t_in1k')
    load_strict(model.backbone, load_state_dict_file(str(backbone_file)), str(backbone_file))
    for key, value in released.items():
        torch.testing.assert_close(model.state_dict()[f'backbone.{key}'], value, rtol=0, atol=0)
