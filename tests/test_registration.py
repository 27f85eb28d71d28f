"""`custom_imports = dict(imports=['mmwf'])` makes our modules buildable under mmdet's and mmseg's scopes.

Each case runs in a fresh interpreter that never imports mmwf itself: only the config does.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent('''
    import sys
    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    assert 'mmwf' not in sys.modules
    cfg = Config.fromfile(sys.argv[1])
    assert 'mmwf' in sys.modules
    init_default_scope(cfg.default_scope)
    from {scope}.registry import MODELS
    model = MODELS.build(cfg.model)
    out = model(torch.randn(1, 3, 64, 96))
    print(type(model).__name__, tuple(out[0].shape))
''')

CONFIG = textwrap.dedent('''
    custom_imports = dict(imports=['mmwf'], allow_failed_imports=False)
    default_scope = '{scope}'
    model = dict(type='WeightFormer', arch='t', out_indices=(16,))
''')


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_backbone_builds_from_a_project_config(scope, tmp_path):
    cfg = tmp_path / f'{scope}_cfg.py'
    cfg.write_text(CONFIG.format(scope=scope))
    res = subprocess.run([sys.executable, '-c', SCRIPT.format(scope=scope), str(cfg)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'WeightFormer (1, 192, 4, 6)' in res.stdout


def test_without_the_plugin_the_error_names_the_registry(tmp_path):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(CONFIG.format(scope='mmdet').replace("custom_imports = dict(imports=['mmwf'], "
                                                        "allow_failed_imports=False)", ''))
    res = subprocess.run([sys.executable, '-c', SCRIPT.format(scope='mmdet').replace(
        "assert 'mmwf' in sys.modules", ''), str(cfg)], capture_output=True, text=True)
    assert res.returncode != 0 and 'WeightFormer is not in the mmdet::model registry' in res.stderr


REGISTRIES = ('MODELS', 'HOOKS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'WEIGHT_INITIALIZERS')


def mmwf_names() -> dict[str, set[str]]:
    """Every name mmwf registers in mmengine's root registries."""
    import mmengine.registry as root

    import mmwf  # noqa: F401
    return {name: {k for k, v in getattr(root, name).module_dict.items()
                   if getattr(v, '__module__', '').startswith('mmwf.')} for name in REGISTRIES}


@pytest.mark.parametrize('project', ['mmdet', 'mmseg', 'mmpretrain'])
def test_no_registered_name_clashes_with_an_mmlab_project(project):
    """A project's child registry finds its own module first: a name both register would silently resolve to the
    project's module under that project's scope (mmpretrain registers an 'LN2d' that returns a permuted view)."""
    from importlib import import_module
    from importlib.util import find_spec
    if find_spec(project) is None:
        pytest.skip(f'{project} is not installed')
    import_module(f'{project}.utils').register_all_modules(init_default_scope=False)
    registries = import_module(f'{project}.registry')
    ours = mmwf_names()
    assert 'WeightFormer' in ours['MODELS'] and 'LayerNorm2d' in ours['MODELS']
    clashes = {name: sorted(ours[name] & set(getattr(registries, name).module_dict))
               for name in REGISTRIES if hasattr(registries, name)}
    assert not any(clashes.values()), clashes


INFER = textwrap.dedent('''
    import sys
    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmdet.apis import DetInferencer
    from mmseg.apis import MMSegInferencer
    out = sys.argv[3]
    for config, Inferencer in ((sys.argv[1], DetInferencer), (sys.argv[2], MMSegInferencer)):
        cfg = Config.fromfile(config)
        init_default_scope(cfg.default_scope)
        model = __import__(cfg.default_scope + '.registry', fromlist=['MODELS']).MODELS.build(cfg.model)
        weights = f'{{out}}/{{cfg.default_scope}}.pth'
        torch.save(dict(state_dict=model.state_dict(),
                        meta=dict(dataset_meta=dict(cfg.test_dataloader.dataset.metainfo))), weights)
        inferencer = Inferencer(model=config, weights=weights, device='cpu')
        result = inferencer(sys.argv[4], out_dir=f'{{out}}/{{cfg.default_scope}}')
        predictions = result['predictions']  # mmdet: a list of dicts; mmseg: the one image's label map
        print(cfg.default_scope, sorted(predictions[0]) if isinstance(predictions, list) else predictions.shape)
''')


@pytest.mark.slow
def test_mmdet_and_mmseg_inferencers_run_our_configs_and_checkpoints(tmp_path):
    """mmdet's DetInferencer and mmseg's MMSegInferencer take our configs and checkpoints as they are, in an
    interpreter that imports mmwf only through the config."""
    import cv2
    import numpy as np
    image = tmp_path / 'image.jpg'
    cv2.imwrite(str(image), np.random.default_rng(0).integers(0, 255, (96, 128, 3), dtype=np.uint8))
    res = subprocess.run([sys.executable, '-c', INFER.format(), 'configs/demo/cascade_wf_t_demo.py',
                          'configs/demo/upernet_wf_t_demo.py', str(tmp_path), str(image)],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "mmdet ['bboxes', 'labels', 'masks', 'scores']" in res.stdout
    assert 'mmseg (96, 128)' in res.stdout
    assert (tmp_path / 'mmdet/vis/image.jpg').is_file() and (tmp_path / 'mmseg/vis/image.jpg').is_file()
