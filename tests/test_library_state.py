"""Library calls change nothing of another library's state: the default scope of mmengine's registries and torch's
global random generator are as they were after them."""
from pathlib import Path

import torch
from mmengine.registry import DefaultScope

ROOT = Path(__file__).resolve().parents[1]


def test_building_a_task_model_leaves_the_current_scope():
    from mmwf.configs import build_task_model, task_model_config
    _, model_cfg = task_model_config(str(ROOT / 'configs/demo/upernet_wf_t_demo.py'))
    with DefaultScope.overwrite_default_scope('mmengine'):
        model = build_task_model('mmseg', model_cfg)
        assert DefaultScope.get_current_instance().scope_name == 'mmengine'
    assert type(model).__name__ == 'EncoderDecoder'


def test_seeded_library_functions_leave_torchs_generator():
    from mmwf.analysis.generation_measures import train_classifier
    images, labels = torch.randint(0, 255, (8, 3, 16, 16), dtype=torch.uint8), torch.arange(8) % 2
    state = torch.get_rng_state()
    first = train_classifier(images, labels, 2, steps=2, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    again = train_classifier(images, labels, 2, steps=2, seed=3)  # seeded by its own seed alone
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters()))
