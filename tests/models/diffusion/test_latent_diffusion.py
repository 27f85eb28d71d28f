"""LatentDiffusion: the preprocessor, a training step that lowers the hybrid loss, seeded sampling, label and VAE
errors."""
import pytest
import torch

from mmwf.registry import MODELS
from tests.tolerance import assert_same_computation


def build(**kwargs):
    return MODELS.build(dict(type='LatentDiffusion', denoiser=dict(
        type='WeightFormerDiT', arch=dict(hidden_size=32, depth=3), input_size=8, in_channels=3, num_classes=3),
        sampling_steps='4', **kwargs))


def test_training_lowers_the_loss_and_sampling_is_seeded():
    torch.manual_seed(0)
    model = build()
    batch = dict(inputs=torch.randint(0, 256, (8, 3, 8, 8), dtype=torch.uint8), labels=torch.arange(8) % 3)
    data = model.data_preprocessor(batch, True)
    assert data['inputs'].min() >= -1 and data['inputs'].max() <= 1 and data['inputs'].dtype == torch.float32
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model(**data, mode='loss')
        assert set(loss) == {'loss_mse', 'loss_vb'}
        total = sum(loss.values())
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(total.item())
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])
    model.eval()
    labels = model.data_preprocessor(dict(labels=[0, 2]), False)['labels']
    first = model(labels=labels, mode='predict')
    assert [r['label'] for r in first] == [0, 2] and first[0]['fake_img'].dtype == torch.uint8
    model.num_sampled = 0
    again = model(labels=labels, mode='predict')
    assert all(torch.equal(a['fake_img'], b['fake_img']) for a, b in zip(first, again))


def test_labels_outside_the_classes_and_a_missing_vae_are_refused(tmp_path):
    model = build(cfg_scale=2.0).eval()
    with pytest.raises(ValueError, match=r'class labels must lie in \[0, 3\).*got 0..3'):
        model(labels=torch.tensor([0, 3]), mode='predict')  # 3 is the unconditional label
    with pytest.raises(ValueError, match='cfg_scale 0.5 < 1'):
        build(cfg_scale=0.5)
    latent = build(vae_path=str(tmp_path / 'vae'))
    with pytest.raises(FileNotFoundError, match='huggingface-cli download stabilityai/sd-vae-ft-ema'):
        latent.vae.encode(torch.zeros(1, 3, 64, 64))
    with pytest.raises(ValueError, match='inputs have 4 channels, the denoiser takes 3'):
        build()(torch.zeros(2, 4, 8, 8), torch.tensor([0, 1]), mode='loss')


@pytest.mark.parametrize('cfg_scale', [1.0, 2.0])
def test_a_samples_noise_follows_its_index_alone(cfg_scale):
    """Sample i is the same in any batch and on any process: its noise comes from a generator seeded with i."""
    model = build(cfg_scale=cfg_scale, sample_seed=3).eval()

    def draw(labels, indices, seeded=model):
        return seeded.sample(torch.tensor(labels), seeded.sample_generators(torch.tensor(indices), 'cpu'))
    together, alone = draw([0, 2, 1], [5, 6, 7]), draw([1], [7])
    assert_same_computation(together[2], alone[0])  # in a batch of 3 and alone: other matrix-product shapes
    assert not torch.allclose(together[0], draw([0], [8])[0])  # another index, another sample
    other_seed = build(cfg_scale=cfg_scale, sample_seed=4).eval()
    other_seed.load_state_dict(model.state_dict())
    assert not torch.allclose(draw([1], [7], other_seed)[0], alone[0])
    # predict: the same per-index samples as images
    images = model(labels=torch.tensor([0, 2, 1]), indices=torch.tensor([5, 6, 7]), mode='predict')
    difference = images[2]['fake_img'].int() - model.to_images(alone)[0].int()
    assert difference.abs().max() <= 1 and images[2]['index'] == 7  # a rounding to uint8 may fall either side
