"""`custom_imports = dict(imports=['mmwf'])` makes our modules buildable under mmdet's and mmseg's scopes.

Each case runs in a fresh interpreter that never imports mmwf itself: only the config does.
"""
import json
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


REGISTRIES = ('MODELS', 'HOOKS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'WEIGHT_INITIALIZERS', 'METRICS', 'DATASETS',
              'TRANSFORMS', 'STRATEGIES')


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
    import_module(f'{project}.utils').register_all_modules(init_default_scope=False)
    registries = import_module(f'{project}.registry')
    ours = mmwf_names()
    assert 'WeightFormer' in ours['MODELS'] and 'LayerNorm2d' in ours['MODELS']
    clashes = {name: sorted(ours[name] & set(getattr(registries, name).module_dict))
               for name in REGISTRIES if hasattr(registries, name)}
    assert not any(clashes.values()), clashes


def test_no_registered_name_clashes_with_mmagic():
    """mmagic 1.2 (not installed here: its names as its source registers them, tests/data) also registers every
    model and pipeline class of diffusers in its MODELS and every diffusers scheduler."""
    import diffusers
    names = json.loads((Path(__file__).parent / 'data' / 'mmagic_1.2.0_registered_names.json').read_text())
    models = set(names['MODELS']) | {n for n in dir(diffusers.models) if isinstance(getattr(diffusers.models, n), type)}
    models |= {n for n in dir(diffusers.pipelines) if isinstance(getattr(diffusers.pipelines, n, None), type)}
    assert {'DiTTransformer2DModel', 'DiTPipeline', 'BasicVSR', 'DDPMScheduler'} <= models | set(
        names['DIFFUSION_SCHEDULERS']) | set(dir(diffusers.schedulers))
    ours = mmwf_names()
    clashes = {name: sorted(ours[name] & (models if name == 'MODELS' else set(names.get(name, []))))
               for name in REGISTRIES}
    assert not any(clashes.values()), clashes


# what `import mmwf` and parsing an mmwf config could change in the process, as comparable values
SNAPSHOT = textwrap.dedent('''
    import sys
    import torch
    from mmengine.fileio.backends import registry_utils as fileio
    from mmengine.logging import HistoryBuffer
    from mmengine.runner import CheckpointLoader
    import mmengine.registry as root
    import mmdet.registry, mmseg.registry, mmpretrain.registry, timm
    from mmdet.utils import register_all_modules as det
    from mmseg.utils import register_all_modules as seg
    from mmpretrain.utils import register_all_modules as pre
    det(False); seg(False); pre(False)

    def registries():
        found = {}
        for module in (root, mmdet.registry, mmseg.registry, mmpretrain.registry):
            for name, reg in vars(module).items():
                if isinstance(reg, root.Registry):
                    found[f'{module.__name__}.{name}'] = dict(reg.module_dict)
        found['timm.models'] = {name: timm.models.model_entrypoint(name) for name in timm.list_models()}
        return found

    def snapshot():
        return dict(
            schemes=dict(CheckpointLoader._schemes), backends=dict(fileio.backends),
            prefixes=dict(fileio.prefix_to_backends),
            buffer={k: v for k, v in vars(HistoryBuffer).items() if k != '_statistics_methods'},
            safe_globals=[g for g in torch.serialization.get_safe_globals()  # torch's own modules add theirs
                          if not getattr(g, '__module__', '').startswith('torch.')], registries=registries(),
            timm_modules={m: sorted(names) for m, names in timm.models._registry._module_to_models.items()})

    before = snapshot()
    from mmengine.config import Config
    for path in sys.argv[1:]:
        Config.fromfile(path)
    assert 'mmwf' in sys.modules
    after = snapshot()
    changed = [key for key in before if key not in ('registries', 'timm_modules') and before[key] != after[key]]
    changed += [f'timm module {m}' for m, names in before['timm_modules'].items() if after['timm_modules'][m] != names]
    for name, entries in before['registries'].items():
        replaced = [k for k, v in entries.items() if after['registries'][name].get(k) is not v]
        if replaced:
            changed.append(f'{name}: {replaced}')
    print('changed:', changed)
    timm_before, timm_after = (set(s['registries']['timm.models']) for s in (before, after))
    print('added timm models:', sorted(timm_after - timm_before))
''')


@pytest.mark.slow
def test_import_and_configs_change_nothing_they_do_not_own():
    """A fresh process: mmdet / mmseg / mmpretrain registered, then every family's mmwf config parsed (which
    imports mmwf): mmengine's checkpoint schemes and file backends, HistoryBuffer, torch's weights-only allow-list
    and every registry entry that existed (timm's models and its module listings included) stay as they were."""
    root = Path(__file__).resolve().parents[1] / 'configs'
    configs = [root / 'cascade_wf_t_coco.py', root / 'upernet_wf_t_ade20k.py', root / 'imagenet/weightformer_t_in1k.py',
               root / 'generation/wf_dit_s_2_in256.py', root / 'linear_attention/mask_rcnn_deit_b_relu_copy_coco.py']
    res = subprocess.run([sys.executable, '-c', SNAPSHOT, *map(str, configs)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'changed: []' in res.stdout, res.stdout
    assert "added timm models: ['deit_b_elu'" in res.stdout  # ours are new names


BROKEN_MMDET = textwrap.dedent('''
    import importlib.abc, importlib.machinery, sys, warnings

    class Broken(importlib.abc.Loader):  # mmdet's own check of the mmcv version, failing at import
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise AssertionError('MMCV==2.2.0 is used but incompatible. Please install mmcv>=2.0.0rc4, <2.2.0.')

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == 'mmdet':
                return importlib.machinery.ModuleSpec(name, Broken())

    sys.meta_path.insert(0, Finder())
    import mmwf
    from mmwf.models.backbones import WeightFormer
    print('imported', WeightFormer.__name__, 'mmdet' in sys.modules)
    try:
        import mmwf.models.roi_heads
    except AssertionError as err:
        print('roi heads:', err)
''')


def test_import_needs_no_mmdet_and_only_the_cascade_head_imports_it():
    """`import mmwf` never imports mmdet (a broken mmdet cannot stop it, and a process that does not detect does not
    pay for it); the Cascade head's module does, and so meets mmdet's own error."""
    res = subprocess.run([sys.executable, '-c', BROKEN_MMDET], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'imported WeightFormer False' in res.stdout
    assert 'roi heads: MMCV==2.2.0 is used but incompatible' in res.stdout
