"""`custom_imports = dict(imports=['mmwf'])` makes our modules buildable under mmdet's and mmseg's scopes.

Each case runs in a fresh interpreter that never imports mmwf itself: only the config does.
"""
import subprocess
import sys
import textwrap

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
