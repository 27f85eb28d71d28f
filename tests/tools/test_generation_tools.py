"""The generation pipeline end to end on small data the test makes: a tiny diffusers VAE, the latent cache tool and
dataset, reference statistics, training and FID testing through tools/train.py / tools/test.py, sample.py's PNGs
and ADM-format .npz, and the DiT checkpoint converter."""
import argparse
import json
import os
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.engine.two_ranks import run_launch, run_ranks_of
from tests.tool_runner import run_tool

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    return run_tool(*args).stdout


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    """Class folders of 32 x 32 shapes, a tiny AutoencoderKL (8x down, 4 latent channels) saved as a diffusers
    folder, and a random FID Inception state dict."""
    from diffusers import AutoencoderKL

    from mmwf.datasets import generate
    from mmwf.evaluation import FIDInception
    root = tmp_path_factory.mktemp('gen')
    generate(str(root / 'demo'), size=32, train=6, val=6, seed=0)
    torch.manual_seed(0)
    AutoencoderKL(block_out_channels=(8, 8, 8, 8), down_block_types=('DownEncoderBlock2D',) * 4,
                  up_block_types=('UpDecoderBlock2D',) * 4, layers_per_block=1, latent_channels=4,
                  norm_num_groups=4, sample_size=32).save_pretrained(root / 'vae')
    inception = FIDInception()  # random weights, batch-norm statistics of shapes images (else features vanish)
    for m in inception.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None
            m.reset_running_stats()
    from mmwf.datasets import ClassFolderImages
    images = ClassFolderImages(str(root / 'demo/cls/train'), 32, flip=False)
    inception.net.train()
    inception(torch.stack([images[i]['inputs'] for i in range(len(images))]))
    torch.save(inception.net.state_dict(), root / 'inception.pth')
    return root


@pytest.mark.slow
def test_latent_cache_holds_samples_of_each_image_and_its_flip(workspace):
    from mmwf.datasets import ClassFolderImages, LatentCacheDataset
    from mmwf.models.diffusion import FrozenVAE
    out = run('tools/generation/extract_latents.py', workspace / 'demo/cls/train', workspace / 'cache', '--vae',
              workspace / 'vae', '--size', 32, '--batch-size', 5, '--num-workers', 0)
    assert 'latent cache of 12 images' in out
    cache = LatentCacheDataset(str(workspace / 'cache'))
    images = ClassFolderImages(str(workspace / 'demo/cls/train'), 32, flip=False)
    assert len(cache) == 12 and cache.metainfo['classes'] == ('circle', 'square', 'triangle')
    assert cache.latents.shape == (12, 2, 4, 4, 4) and cache.latents.dtype == np.float16
    vae = FrozenVAE(str(workspace / 'vae'))
    x = torch.stack([images[i]['inputs'] for i in range(12)]).float() / 127.5 - 1
    for copy, view in ((0, x), (1, x.flip(-1))):
        dist = vae.vae.encode(view).latent_dist
        z = (torch.from_numpy(np.asarray(cache.latents[:, copy], dtype=np.float32)) / vae.scale - dist.mean) / dist.std
        assert z.abs().max() < 6 and 0.5 < z.std() < 1.5  # a sample of this image's (or flip's) latent distribution
    assert [cache[i]['labels'] for i in range(12)] == [images.items[i][1] for i in range(12)]
    # two processes, 6 images each, into one cache: image i's samples come from its index alone
    env = dict(os.environ, OMP_NUM_THREADS='1')
    res = run_ranks_of(lambda out: [
        'tools/generation/extract_latents.py', str(workspace / 'demo/cls/train'), str(out), '--vae',
        str(workspace / 'vae'), '--size', '32', '--batch-size', '5', '--num-workers', '0', '--launcher', 'pytorch'],
        workspace / 'cache2', env)
    assert res.returncode == 0, res.stderr[-3000:]
    two = LatentCacheDataset(str(res.out))
    assert np.array_equal(np.asarray(two.labels), np.asarray(cache.labels))
    np.testing.assert_allclose(np.asarray(two.latents, np.float32), np.asarray(cache.latents, np.float32),
                               rtol=1e-3, atol=1e-3)  # the VAE meets the images in other batches
    with pytest.raises(FileNotFoundError, match='extract_latents.py'):
        LatentCacheDataset(str(workspace / 'nothing'))


@pytest.mark.slow
@pytest.mark.xdist_group('generation-fid')  # the longest test: free to run beside the file's others
def test_train_then_fid_with_test_py_and_the_same_samples_through_sample_py(workspace, tmp_path):
    """Train, test (FID / IS) with one process and with two, sample with one process and with two: the same seven
    samples everywhere (each drawn from its index), so the same FID, and the same .npz; a sampling run started
    again draws only the PNGs that are missing."""
    config = tmp_path / 'tiny_gen.py'
    config.write_text(f"""_base_ = '{ROOT}/configs/generation/wf_dit_s_2_in256.py'
model = dict(denoiser=dict(arch=dict(_delete_=True, hidden_size=32, depth=3), input_size=4, num_classes=3),
             vae_path='{workspace / 'vae'}', sampling_steps='3')
train_dataloader = dict(batch_size=4, num_workers=0, persistent_workers=False,
                        dataset=dict(_delete_=True, type='ClassFolderImages', root='{workspace / 'demo/cls/train'}',
                                     size=32))
test_dataloader = dict(batch_size=3, dataset=dict(num_samples=7, num_classes=3))
test_evaluator = dict(reference='{tmp_path / 'ref.npz'}', inception='{workspace / 'inception.pth'}', is_split_size=4)
train_cfg = dict(max_iters=2)
default_hooks = dict(checkpoint=dict(interval=2))
env_cfg = dict(dist_cfg=dict(backend='gloo'))
auto_scale_lr = dict(base_batch_size=4)
""")
    run('tools/generation/fid_stats.py', workspace / 'demo/cls/val', tmp_path / 'ref.npz', '--inception',
        workspace / 'inception.pth', '--size', 32)
    run('tools/train.py', config, '--work-dir', tmp_path / 'work')
    checkpoint = tmp_path / 'work' / 'iter_2.pth'
    out = run('tools/test.py', config, checkpoint, '--work-dir', tmp_path / 'work', '--out-json', tmp_path / 'm.json')
    metrics = json.loads((tmp_path / 'm.json').read_text())
    fid = next(v for k, v in metrics.items() if k.endswith('FID'))
    assert fid > 1 and 'gen/IS' in out and metrics['gen/samples'] == 7
    # two processes: 4 + 3 samples (the sampler pads the second process with a copy of sample 0, not counted)
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHON=sys.executable)
    res = run_launch(lambda out, port: ['bash', 'tools/dist_test.sh', str(config), str(checkpoint), '2', '--work-dir',
                                        str(out), '--out-json', str(out / 'm2.json')], tmp_path / 'work2', env)
    assert res.returncode == 0, res.stderr[-3000:]
    two = json.loads((res.out / 'm2.json').read_text())
    assert two['gen/samples'] == 7
    # the same samples; the Inception meets them in other batches (float rounding): the spread of two IS parts
    # moves by about 1e-7
    assert {k: two[k] for k in metrics} == pytest.approx(metrics, rel=1e-6, abs=1e-6)

    run('tools/generation/sample.py', config, checkpoint, '--num-samples', 7, '--batch-size', 3, '--out',
        tmp_path / 'samples')
    with np.load(tmp_path / 'samples' / 'samples_7.npz') as data:
        one = data['arr_0']
        assert one.shape == (7, 32, 32, 3) and one.dtype == np.uint8 and data['labels'].shape == (7,)
    assert len(list((tmp_path / 'samples').glob('*.png'))) == 7
    res = run_ranks_of(lambda out: [
        'tools/generation/sample.py', str(config), str(checkpoint), '--num-samples', '7',
        '--batch-size', '2', '--out', str(out), '--launcher', 'pytorch'], tmp_path / 'samples2', env)
    assert res.returncode == 0, res.stderr[-3000:]
    for gone in ('000002.png', '000005.png'):  # as if the run had been stopped before them
        (res.out / gone).unlink()
    again = run('tools/generation/sample.py', config, checkpoint, '--num-samples', 7, '--out', res.out)
    assert '5 samples found' in again and '7 / 7 samples' in again
    with np.load(res.out / 'samples_7.npz') as data:
        assert np.array_equal(data['arr_0'], one)
    # the reference statistics from two processes (every other image each, the sums added) equal one process's
    res = run_ranks_of(lambda out: [
        'tools/generation/fid_stats.py', str(workspace / 'demo/cls/val'), str(out / 'ref2.npz'),
        '--inception', str(workspace / 'inception.pth'), '--size', '32', '--launcher', 'pytorch'], tmp_path / 'ref2',
        env)
    assert res.returncode == 0, res.stderr[-3000:]
    with np.load(tmp_path / 'ref.npz') as a, np.load(res.out / 'ref2.npz') as b:
        # the Inception meets the images in other batches: float32 features agree to about 5e-5, so mu within that
        # and sigma (six images) within 1e-3 of its largest entry
        np.testing.assert_allclose(b['mu'], a['mu'], rtol=2e-4, atol=1e-6)
        np.testing.assert_allclose(b['sigma'], a['sigma'], rtol=0, atol=1e-3 * np.abs(a['sigma']).max())
    run('tools/generation/fid_stats.py', tmp_path / 'samples' / 'samples_7.npz', tmp_path / 'fake.npz', '--inception',
        workspace / 'inception.pth')
    from mmwf.evaluation import frechet_distance, load_statistics
    with warnings.catch_warnings():  # seven samples of 2048-dim features: the product may be flagged singular
        warnings.simplefilter('ignore', UserWarning)
        same = frechet_distance(*load_statistics(str(tmp_path / 'fake.npz')),
                                *load_statistics(str(tmp_path / 'ref.npz')))
    assert same == pytest.approx(fid, rel=1e-3)  # the same seven samples (seeds, labels, EMA weights) both ways


@pytest.mark.slow
def test_dit_checkpoint_converter(tmp_path):
    from mmengine.config import Config

    from mmwf.registry import MODELS
    config = ROOT / 'configs/demo/wf_dit_gen_demo.py'
    denoiser = MODELS.build(Config.fromfile(str(config)).model.denoiser)
    ema = {k: v + 1 for k, v in denoiser.state_dict().items()}
    torch.save(dict(model=denoiser.state_dict(), ema=ema, opt={}, args=argparse.Namespace(model='WF-DiT')),
               tmp_path / '0400000.pt')
    run('tools/model_converters/dit_to_mmwf.py', tmp_path / '0400000.pt', tmp_path / 'out.pth', '--config', config)
    state = torch.load(tmp_path / 'out.pth', weights_only=True)['state_dict']
    assert torch.equal(state['denoiser.blocks.1.linear1.w1'], ema['blocks.1.linear1.w1'])
    model = MODELS.build(Config.fromfile(str(config)).model)
    model.load_state_dict(state)  # strict
    res = run_tool('tools/model_converters/dit_to_mmwf.py', tmp_path / '0400000.pt', tmp_path / 'bad.pth', '--config',
                   ROOT / 'configs/demo/dit_gen_demo.py', ok=False)
    assert re.search(r'does not match the denoiser of .*\(DiT\)', res.stderr)
    assert 'missing keys' in res.stderr and not (tmp_path / 'bad.pth').exists()


def test_an_fsdp_config_without_a_launcher_is_refused_before_any_work(tmp_path):
    res = run_tool('tools/train.py', ROOT / 'configs/generation/wf_dit_b_2_in256_fsdp.py', '--work-dir', tmp_path,
                   ok=False)
    assert re.search(r'wf_dit_b_2_in256_fsdp.py: strategy ResumableFSDPStrategy shards the model over processes and '
                     r'needs a launcher: bash tools/dist_train.sh .*wf_dit_b_2_in256_fsdp.py GPUS', res.stderr)
    assert 'process group' not in res.stderr and not any(tmp_path.iterdir())  # nothing started, nothing written


@pytest.mark.slow
def test_fsdp_config_trains_on_two_processes_with_whole_checkpoints(workspace, tmp_path):
    """The B/2 FSDP config (at toy size, pixel space) through tools/dist_train.sh on two gloo processes:
    FlexibleRunner with mmwf's FSDP strategy (adapted to the CPU), DiT's per-rank seeds, and a whole, plain
    checkpoint with the EMA that the denoiser loads strictly."""
    config = tmp_path / 'tiny_fsdp.py'
    config.write_text(f"""_base_ = '{ROOT}/configs/generation/wf_dit_b_2_in256_fsdp.py'
model = dict(denoiser=dict(arch=dict(_delete_=True, hidden_size=32, depth=3), in_channels=3, num_classes=3),
             vae_path=None)
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(_delete_=True, type='ClassFolderImages', root='{workspace / 'demo/cls/train'}',
                                     size=32))
test_dataloader = None
test_evaluator = None
test_cfg = None
train_cfg = dict(max_iters=2)
default_hooks = dict(checkpoint=dict(interval=2))
env_cfg = dict(dist_cfg=dict(backend='gloo'))
auto_scale_lr = dict(base_batch_size=4)
""")
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHON=sys.executable)
    res = run_launch(lambda out, port: ['bash', 'tools/dist_train.sh', str(config), '2', '--work-dir', str(out)],
                     tmp_path / 'work', env)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert 'rank 0 of 2: seed 0 (seed * world_size + rank, seed 0)' in log  # rank 0 logs; seed 0 * 2 + 0
    checkpoint = torch.load(res.out / 'iter_2.pth', weights_only=True)
    from mmengine.config import Config

    from mmwf.registry import MODELS
    denoiser = MODELS.build(Config.fromfile(str(config)).model.denoiser)
    for part in ('state_dict', 'ema_state_dict'):
        state = {k.removeprefix('module.').removeprefix('denoiser.'): v for k, v in checkpoint[part].items()
                 if k.removeprefix('module.').startswith('denoiser.')}
        denoiser.load_state_dict(state)  # every tensor whole: strict load
