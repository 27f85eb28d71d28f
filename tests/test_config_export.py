"""mmwf.configs: the packaged configs, their export as self-contained files, and a project of its own that
inherits them and trains with mmdet's / mmseg's own train.py."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mmengine.config import Config

from mmwf.configs import CONFIG_ROOT, FormattedOnceConfig, config_file, config_files, export_config, formatted_once
from tests.tool_runner import run_python, run_tool

ROOT = Path(__file__).resolve().parents[1]


def test_every_repository_config_is_packaged_under_one_name():
    names = config_files()
    repo = {p.stem for p in (ROOT / 'configs').rglob('*.py') if '_base_' not in p.parts}
    assert set(names) == repo
    assert (CONFIG_ROOT / '..' / 'model-index.yml').resolve().is_file()


@pytest.mark.parametrize('name', ['cascade_wf_t_coco', 'upernet_deit_s_ade20k', 'weightformer_t_in1k',
                                  'mask_rcnn_deit_b_ttt_copy_distill_coco', 'upernet_wf_t_demo'])
def test_export_is_self_contained_and_equal(name, tmp_path):
    out = export_config(name, tmp_path / 'new' / 'folder')
    text = out.read_text()
    assert not re.search(r'^_base_\s*=', text, re.MULTILINE) and 'mmdet::' not in text
    assert Config.fromfile(str(out)).to_dict() == Config.fromfile(str(config_file(name))).to_dict()


def test_unknown_name_and_file_dest_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"no mmwf config named 'cascade_wf_t_cco'; did you mean cascade_wf_t_coco"):
        config_file('cascade_wf_t_cco')
    (tmp_path / 'f').write_text('')
    with pytest.raises(NotADirectoryError, match='is a file; give a folder'):
        export_config('cascade_wf_t_coco', tmp_path / 'f')


def test_the_config_text_is_mmengines_formatted_once_for_each_content(monkeypatch):
    """A FormattedOnceConfig's pretty_text is a plain Config's, each computed apart; yapf formats it once however
    often it is asked, in a copy too (a runner holds a deep copy), and again once the dict has changed."""
    import copy

    import mmengine.config.config as mmengine_config
    path = str(config_file('upernet_wf_t_demo'))
    plain, changed = Config.fromfile(path), Config.fromfile(path)
    changed.model.backbone.drop_path_rate = 0.25
    expected, expected_changed = plain.pretty_text, changed.pretty_text
    assert expected != expected_changed
    calls = []
    format_code = mmengine_config.FormatCode
    monkeypatch.setattr(mmengine_config, 'FormatCode', lambda *a, **k: calls.append(1) or format_code(*a, **k))
    cfg = formatted_once(plain)
    assert [cfg.pretty_text for _ in range(3)] == [expected] * 3 and len(calls) == 1
    held = copy.deepcopy(cfg)
    assert type(held) is FormattedOnceConfig and held.pretty_text == expected and len(calls) == 1
    held.model.backbone.drop_path_rate = 0.25
    assert held.pretty_text == expected_changed and held.pretty_text == expected_changed and len(calls) == 2
    assert formatted_once(held) is held and formatted_once(dict(a=1)).to_dict() == dict(a=1)


@pytest.mark.slow
def test_command_line_lists_and_exports(tmp_path):
    listed = run_tool('-m', 'mmwf.configs', '--list', cwd=tmp_path).stdout.split()
    assert {'cascade_wf_t_coco', 'upernet_wf_t_ade20k_whole', 'deit_b_ttt_in1k'} <= set(listed)
    bad = run_tool('-m', 'mmwf.configs', 'nope', cwd=tmp_path, ok=False)
    assert bad.returncode == 1 and 'no mmwf config named' in bad.stderr


WORKERS = [f'{loader}_dataloader.{key}' for loader in ('train', 'val', 'test')
           for key in ('num_workers=0', 'persistent_workers=False')]
# the runs shortened for a CPU: one iteration at 64 (one image a batch, in fp32, for detection; two for segmentation,
# whose pooling module's batch norm needs them), one epoch for classification; the detector tests 100 proposals and
# keeps 20 detections an image (1000 and 100 cost the CPU its three box heads and the mask head: 3 s an image)
DENSE = ['image_size=64', 'train_cfg.max_iters=1', 'train_cfg.val_interval=1', *WORKERS]
GUIDE_RUNS = {
    'my_det': ('mmdet', 'cascade_wf_t_coco', 'coco', 'coco/bbox_mAP', 64, 'iter_1.pth',
               [*DENSE, 'optim_wrapper.type=OptimWrapper', 'train_dataloader.batch_size=1',
                'model.test_cfg.rpn.max_per_img=100', 'model.test_cfg.rcnn.max_per_img=20']),
    'my_seg': ('mmseg', 'upernet_wf_t_ade20k', 'ade', 'mIoU', 64, 'iter_1.pth',
               [*DENSE, 'train_dataloader.batch_size=2']),
    'my_cls': ('mmpretrain', 'weightformer_t_in1k', 'cls', 'accuracy/top1', 64, 'epoch_1.pth',
               ['image_size=64', 'train_cfg.max_epochs=1', 'train_dataloader.batch_size=8',
                'val_dataloader.batch_size=8', 'optim_wrapper.type=OptimWrapper', *WORKERS])}


@pytest.mark.slow
@pytest.mark.parametrize('config', [pytest.param(name, marks=pytest.mark.xdist_group(f'guide:{name}'))
                                    for name in GUIDE_RUNS])
def test_the_guides_own_class_configs_train_validate_and_test(config, demo_data, tmp_path):
    """docs/guides/your_project.md's my_det.py, my_seg.py and my_cls.py as printed, in a project folder outside the
    repository with the paper's config exported beside it (the guide's export command), the demo's shapes as the
    user's data and the pretrained backbone the dense ones start from (random weights here): training with
    validation, then a test, with the train.py / test.py in mmdet's, mmseg's or mmpretrain's wheel. The class checks
    pass and the evaluators score the user's classes; the size given by option reaches every field that follows
    it."""
    import torch
    from safetensors.torch import save_file

    from mmwf.models.backbones import WeightFormer
    from tests.test_docs import block
    scope, base, demo, metric, size, checkpoint, options = GUIDE_RUNS[config]
    project = tmp_path / 'project'
    env = dict(os.environ, OMP_NUM_THREADS='1')

    def run(*args):
        res = run_python(args, cwd=project, env=env)  # mmdet's, mmseg's, mmpretrain's tools: a fresh interpreter
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return res.stdout + res.stderr

    project.mkdir()
    export = block('guides/your_project.md', 'python -m mmwf.configs --list').splitlines()[1].split('#')[0].split()
    assert base in export  # the guide's export command writes the config the file inherits
    run('-m', 'mmwf.configs', base, '--dest', 'configs')
    (project / f'configs/{config}.py').write_text(block('guides/your_project.md', f'# configs/{config}.py'))
    mine = re.search(r"data_root = 'data/(\w+)/'", (project / f'configs/{config}.py').read_text()).group(1)
    (project / 'data').mkdir()
    (project / 'data' / mine).symlink_to(demo_data / demo)
    if scope != 'mmpretrain':
        (project / 'checkpoints').mkdir()
        torch.manual_seed(0)
        save_file(WeightFormer('t').state_dict(), str(project / 'checkpoints/weightformer_t.safetensors'))
    tools = Path(__import__(scope).__file__).parent / '.mim/tools'
    log = run(str(tools / 'train.py'), f'configs/{config}.py', '--work-dir', f'work_dirs/{config}',
              '--cfg-options', *options)
    assert f'Saving checkpoint at 1 {"epochs" if scope == "mmpretrain" else "iterations"}' in log and metric in log
    ran = Config.fromfile(str(project / f'work_dirs/{config}/{config}.py'))  # the config the run dumped
    assert ran.image_size in (size, (size, size))
    if scope == 'mmpretrain':
        crops = [t.crop_size for t in ran.test_dataloader.dataset.pipeline if t.type == 'CenterCrop']
        assert crops == [size] and ran.model.backbone.num_classes == 3
    else:
        assert ran.train_dataloader.dataset.metainfo.classes == ran.test_dataloader.dataset.metainfo.classes
        crops = [t.crop_size for t in ran.train_dataloader.dataset.pipeline if t.type == 'RandomCrop']
        assert crops == [(size, size)]
        assert (ran.model.data_preprocessor.get('pad_size_divisor') or ran.model.data_preprocessor.size[0]) == size
        classes = Config.fromfile(str(project / f'configs/{config}.py')).metainfo.classes
        heads = ran.model.roi_head.bbox_head if scope == 'mmdet' else [ran.model.decode_head]
        assert {h.num_classes for h in heads} == {len(classes)}
    # mmseg's test.py builds mmengine's Runner whatever the config names: it takes the config the run wrote, where
    # the sizes have followed (the guide says so); mmdet's and mmpretrain's build the runner the config names
    tested = [f'work_dirs/{config}/{config}.py', *WORKERS] if scope == 'mmseg' else [f'configs/{config}.py', *options]
    log = run(str(tools / 'test.py'), tested[0], f'work_dirs/{config}/{checkpoint}', '--work-dir',
              f'work_dirs/{config}_test', '--cfg-options', *tested[1:])
    assert metric in log


@pytest.mark.slow
def test_an_installed_wheel_carries_and_exports_the_configs(demo_data, tmp_path):
    """The wheel holds mmwf/.mim (configs, model index and tools as files, not links), exports from there, and its
    tools train and test a config from a folder outside the repository (OpenMMLab's layout: what
    ``mim train mmwf CONFIG`` runs)."""
    wheels, site, out = tmp_path / 'wheels', tmp_path / 'site', tmp_path / 'out'
    pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check', '-q']
    subprocess.run([*pip, 'wheel', '--no-deps', '--no-build-isolation', str(ROOT), '-w', str(wheels)], check=True,
                   capture_output=True)
    subprocess.run([*pip, 'install', '--no-deps', '--target', str(site), *map(str, wheels.glob('mmwf-*.whl'))],
                   check=True, capture_output=True)
    packaged = site / 'mmwf/.mim'
    assert not (packaged / 'configs').is_symlink() and (packaged / 'model-index.yml').is_file()
    assert {p.stem for p in (packaged / 'configs').rglob('*.py')} >= set(config_files())
    env = dict(os.environ, PYTHONPATH=str(site))
    res = subprocess.run([sys.executable, '-c', 'import mmwf.configs as c; print(c.CONFIG_ROOT); c.main()',
                          'upernet_wf_s_ade20k', '--dest', str(out)], cwd=tmp_path, env=env, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith(str(packaged))
    exported = Config.fromfile(str(out / 'upernet_wf_s_ade20k.py')).to_dict()
    assert exported == Config.fromfile(str(config_file('upernet_wf_s_ade20k'))).to_dict()

    tools, work = packaged / 'tools', tmp_path / 'work'
    assert not tools.is_symlink() and (tools / 'train.py').is_file() and (tools / 'dist_train.sh').is_file()
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'demo').symlink_to(demo_data)
    config = packaged / 'configs/demo/upernet_wf_t_demo.py'
    res = subprocess.run([sys.executable, str(tools / 'train.py'), str(config), '--work-dir', str(work),
                          '--cfg-options', 'train_cfg.max_iters=1', 'train_cfg.val_begin=2',
                          'default_hooks.checkpoint.interval=1', 'train_dataloader.batch_size=2'],
                         cwd=tmp_path, env=dict(env, OMP_NUM_THREADS='1'), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    res = subprocess.run([sys.executable, str(tools / 'test.py'), str(config), str(work / 'iter_1.pth'),
                          '--work-dir', str(work)], cwd=tmp_path, env=dict(env, OMP_NUM_THREADS='1'),
                         capture_output=True, text=True)
    assert res.returncode == 0 and 'mIoU' in res.stdout + res.stderr, res.stderr[-3000:]
