"""The Table 7 configs are DiT's recipe and differ from their base only in the denoiser; the demos change data, size
and schedule only."""
from glob import glob
from pathlib import Path

import pytest
from mmengine.config import Config

ROOT = Path(__file__).resolve().parents[2]
ROWS = sorted(p for p in glob(str(ROOT / 'configs/generation/*_in256.py')))


def test_twelve_rows_of_table_7():
    assert sorted(Path(p).stem for p in ROWS) == sorted(
        f'{family}_{a}_{p}_in256' for family in ('wf_dit', 'dit') for a in 'sb' for p in (2, 4, 8))


@pytest.mark.parametrize('path', ROWS, ids=lambda p: Path(p).stem)
def test_dits_recipe_and_one_difference(path):
    cfg = Config.fromfile(path)
    base = Config.fromfile(str(ROOT / 'configs/generation/_base_/latent_diffusion_in256.py'))
    family, arch, patch, _ = Path(path).stem.rsplit('_', 3)
    assert cfg.model.denoiser == dict(base.model.denoiser, type='WeightFormerDiT' if family == 'wf_dit' else 'DiT',
                                      arch=arch.upper(), patch_size=int(patch))
    assert {k: v for k, v in cfg.model.items() if k != 'denoiser'} == {
        k: v for k, v in base.model.items() if k != 'denoiser'}
    # DiT's AdamW, by torch's fused kernel (the same update)
    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', fused=True, lr=1e-4, weight_decay=0.0)
    assert cfg.train_dataloader.batch_size * 8 == 256 and cfg.train_cfg.max_iters == 400_000
    ema = next(h for h in cfg.custom_hooks if h['type'] == 'FlexibleEMAHook')
    assert ema['momentum'] == pytest.approx(1 - 0.9999)
    assert cfg.model.sampling_steps == '250' and cfg.model.cfg_scale == 1.0
    assert cfg.test_dataloader.dataset.num_samples == 50_000
    assert dict(type='NonFiniteLossHook') in cfg.custom_hooks


@pytest.mark.parametrize('demo,row,family', [('wf_dit_gen_demo', 'wf_dit_s_2_in256', 'WeightFormerDiT'),
                                             ('dit_gen_demo', 'dit_s_2_in256', 'DiT')])
def test_demos_differ_in_data_size_and_schedule(demo, row, family):
    """A demo is the Table 7 row it names with only the data (3 classes of 16 x 16 pixels, no VAE), the size
    (width 128; depth 5 for WF-DiT, 4 for DiT: the paper's 15 : 12), the sampling and the schedule changed: the
    denoiser's type, patch and block settings and the diffusion are the row's."""
    cfg = Config.fromfile(str(ROOT / f'configs/demo/{demo}.py'))
    real = Config.fromfile(str(ROOT / f'configs/generation/{row}.py'))
    assert real.model.denoiser.type == family and real.model.denoiser.arch == 'S'
    depth = 5 if family == 'WeightFormerDiT' else 4
    small = dict(hidden_size=128, depth=depth, **(dict(num_heads=4) if family == 'DiT' else {}))
    assert cfg.model.to_dict() == dict(
        real.model.to_dict(), denoiser=dict(real.model.denoiser.to_dict(), arch=small, input_size=16, in_channels=3,
                                            num_classes=3),
        vae_path=None, sampling_steps='50', cfg_scale=4.0)
    # outside the model: the data, the schedule (iterations, learning rate, EMA horizon) and the CPU run's settings
    changed = {k for k in set(cfg) | set(real) if cfg.get(k, 'absent') != real.get(k, 'absent')}
    assert changed == {'model', 'num_classes', 'train_dataloader', 'test_dataloader', 'test_cfg', 'test_evaluator',
                       'max_iters', 'train_cfg', 'optim_wrapper', 'custom_hooks', 'default_hooks', 'env_cfg',
                       'auto_scale_lr'}
    assert (cfg.num_classes, cfg.max_iters, cfg.test_dataloader, cfg.test_cfg, cfg.test_evaluator) == (
        3, 2200, None, None, None)
    assert cfg.train_dataloader.dataset == dict(type='ClassFolderImages', root='data/demo/gen/train', size=16)
    loader = ('batch_size', 'num_workers', 'persistent_workers', 'dataset')
    assert {k: v for k, v in cfg.train_dataloader.items() if k not in loader} == {
        k: v for k, v in real.train_dataloader.items() if k not in loader}  # sampler, collate, drop_last
    assert cfg.train_cfg == dict(real.train_cfg, max_iters=2200, val_interval=2201)
    assert cfg.optim_wrapper == dict(real.optim_wrapper, optimizer=dict(real.optim_wrapper.optimizer, lr=3e-3))
    assert cfg.custom_hooks == [dict(real.custom_hooks[0], momentum=5e-3), real.custom_hooks[1]]
    assert cfg.env_cfg == dict(real.env_cfg, dist_cfg=dict(backend='gloo'))
    assert cfg.auto_scale_lr == dict(real.auto_scale_lr, base_batch_size=cfg.train_dataloader.batch_size)
    # built: the row's blocks (MLP 4 x D, WF-DiT's dynamic blocks every third from block 1) at the demo's size
    from mmwf.registry import MODELS
    net = MODELS.build(cfg.model.denoiser)
    assert len(net.blocks) == depth and net.learn_sigma and net.x_embedder.proj.kernel_size == (2, 2)
    assert all(b.adaLN_modulation[1].in_features == 128 for b in net.blocks)
    if family == 'WeightFormerDiT':
        assert net.dynamic_ids == {1, 4}
        assert [b.linear2.in_features for b in net.blocks] == [512] * depth
    else:
        assert [b.mlp.fc2.in_features for b in net.blocks] == [512] * depth and net.blocks[0].attn.num_heads == 4


@pytest.mark.parametrize('precision', ['bf16', 'fp16'])
@pytest.mark.parametrize('family', ['wf_dit', 'dit'])
def test_mixed_precision_variants_change_the_optimizer_wrapper_only(family, precision):
    """*_bf16 / *_fp16: the B/2 row under autocast (fp16 with a dynamic loss scale), nothing else changed; without
    CUDA the wrapper falls back to the row's fp32 one."""
    import torch

    from mmwf.utils import adapt_to_device
    cfg = Config.fromfile(str(ROOT / f'configs/generation/{family}_b_2_in256_{precision}.py'))
    row = Config.fromfile(str(ROOT / f'configs/generation/{family}_b_2_in256.py'))
    assert {k for k in set(cfg) | set(row) if cfg.get(k, 'absent') != row.get(k, 'absent')} == {'optim_wrapper'}
    amp = dict(dtype='bfloat16') if precision == 'bf16' else dict(dtype='float16', loss_scale='dynamic')
    assert cfg.optim_wrapper == dict(row.optim_wrapper, type='AmpOptimWrapper', **amp)
    if not torch.cuda.is_available():
        adapt_to_device(cfg)
        assert cfg.optim_wrapper == row.optim_wrapper


@pytest.mark.parametrize('family', ['wf_dit', 'dit'])
def test_fsdp_variants_change_the_runner_only(family):
    """*_fsdp: the B/2 row under FlexibleRunner with mmwf's FSDP strategy (whole checkpoints), nothing else changed;
    the row's EMA hook is the one that runs under FlexibleRunner."""
    cfg = Config.fromfile(str(ROOT / f'configs/generation/{family}_b_2_in256_fsdp.py'))
    row = Config.fromfile(str(ROOT / f'configs/generation/{family}_b_2_in256.py'))
    assert {k for k in set(cfg) | set(row) if cfg.get(k, 'absent') != row.get(k, 'absent')} == {'runner_type',
                                                                                              'strategy'}
    assert cfg.runner_type == 'FlexibleRunner'
    assert cfg.strategy == dict(type='ResumableFSDPStrategy', state_dict_cfg='full',
                                model_wrapper=dict(use_orig_params=True))
    assert row.custom_hooks[0]['type'] == 'FlexibleEMAHook'
