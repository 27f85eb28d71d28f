"""What the generation tools are given is checked before their work: sample arrays of another dtype or scale, output
paths, configs without what the tool needs, and a folder of samples drawn with other settings."""
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tool_runner import run_tool

ROOT = Path(__file__).resolve().parents[2]


def fails(*args) -> str:
    return run_tool(*args, ok=False).stderr


def test_fid_stats_refuses_float_images_and_a_folder_as_its_output(tmp_path):
    """DiTPipeline(output_type='np') gives floats in [0, 1]; divided by 255 as uint8 they were measured as black."""
    np.savez(tmp_path / 'float.npz', arr_0=np.random.default_rng(0).random((4, 8, 8, 3), dtype=np.float32))
    err = fails('tools/generation/fid_stats.py', tmp_path / 'float.npz', tmp_path / 'stats.npz', '--inception', 'no')
    assert "arr_0 of '" in err and 'is float32 in [' in err and 'not uint8 in [0, 255]' in err
    assert 'np.clip(np.round(x * 255), 0, 255).astype(np.uint8)' in err
    np.savez(tmp_path / 'ok.npz', arr_0=np.zeros((4, 8, 8, 3), np.uint8))
    err = fails('tools/generation/fid_stats.py', tmp_path / 'ok.npz', tmp_path, '--inception', 'no')
    assert f'error: out: {tmp_path} is a folder; give a file name' in err


@pytest.fixture(scope='module')
def sampling_config(tmp_path_factory):
    """The generation demo's model (3 classes, 16 x 16 pixels) with a test loader drawing the labels, 4 sampling
    steps, and a checkpoint of random weights."""
    from mmengine.config import Config

    from mmwf.registry import MODELS
    folder = tmp_path_factory.mktemp('sampling')
    config = folder / 'gen.py'
    config.write_text(f"_base_ = '{ROOT / 'configs/demo/wf_dit_gen_demo.py'}'\n"
                      "model = dict(sampling_steps='4')\n"
                      "test_dataloader = dict(_delete_=True, batch_size=4, num_workers=0, "
                      "sampler=dict(type='DefaultSampler', shuffle=False), collate_fn=dict(type='default_collate'), "
                      "dataset=dict(type='SamplingLabels', num_samples=4, num_classes=3, seed=0))\n")
    torch.manual_seed(0)
    torch.save(dict(state_dict=MODELS.build(Config.fromfile(str(config)).model).state_dict()), folder / 'w.pth')
    return config, folder / 'w.pth'


@pytest.mark.slow
def test_sample_refuses_a_folder_drawn_otherwise_and_a_config_without_labels(sampling_config, tmp_path):
    config, weights = sampling_config
    out = tmp_path / 'samples'
    run_tool('tools/generation/sample.py', config, weights, '--num-samples', '3', '--out', out)
    assert len(list(out.glob('*.png'))) == 3 and (out / 'sampling.json').is_file()
    err = fails('tools/generation/sample.py', config, weights, '--num-samples', '3', '--out', out, '--cfg-scale', 2)
    assert f'error: {out} holds samples drawn with other settings (sampling.json)' in err
    assert 'model.cfg_scale: 4.0 -> 2.0' in err and 'Sample into a new --out' in err
    (out / 'sampling.json').unlink()
    err = fails('tools/generation/sample.py', config, weights, '--num-samples', '3', '--out', out)
    assert 'holds PNGs but no sampling.json saying what drew them' in err
    err = fails('tools/generation/sample.py', ROOT / 'configs/demo/wf_dit_gen_demo.py', weights, '--out',
                tmp_path / 'other')
    assert 'lacks test_dataloader (whose dataset draws the labels of the samples)' in err
    assert 'configs/generation/wf_dit_s_2_in256.py' in err
