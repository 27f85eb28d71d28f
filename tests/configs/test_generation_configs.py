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
    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', lr=1e-4, weight_decay=0.0)
    assert cfg.train_dataloader.batch_size * 8 == 256 and cfg.train_cfg.max_iters == 400_000
    ema = next(h for h in cfg.custom_hooks if h['type'] == 'EMAHook')
    assert ema['momentum'] == pytest.approx(1 - 0.9999)
    assert cfg.model.sampling_steps == '250' and cfg.model.cfg_scale == 1.0
    assert cfg.test_dataloader.dataset.num_samples == 50_000
    assert dict(type='NonFiniteLossHook') in cfg.custom_hooks


def test_demos_differ_in_data_size_and_schedule():
    wf = Config.fromfile(str(ROOT / 'configs/demo/wf_dit_gen_demo.py'))
    dit = Config.fromfile(str(ROOT / 'configs/demo/dit_gen_demo.py'))
    assert wf.model.vae_path is None and wf.model.denoiser.in_channels == 3 and wf.model.denoiser.num_classes == 3
    assert dit.model.denoiser.type == 'DiT'
    assert dit.model.denoiser.arch.hidden_size == wf.model.denoiser.arch.hidden_size
    assert {k: v for k, v in dit.items() if k != 'model'} == {k: v for k, v in wf.items() if k != 'model'}
