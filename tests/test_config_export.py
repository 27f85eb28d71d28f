"""mmwf.configs: the packaged configs, their export as self-contained files, and a project of its own that
inherits them and trains with mmdet's / mmseg's own train.py."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mmengine.config import Config

from mmwf.configs import CONFIG_ROOT, config_file, config_files, export_config

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


@pytest.mark.slow
def test_command_line_lists_and_exports(tmp_path):
    listed = subprocess.run([sys.executable, '-m', 'mmwf.configs', '--list'], cwd=tmp_path, capture_output=True,
                            text=True, check=True).stdout.split()
    assert {'cascade_wf_t_coco', 'upernet_wf_t_ade20k_whole', 'deit_b_ttt_in1k'} <= set(listed)
    bad = subprocess.run([sys.executable, '-m', 'mmwf.configs', 'nope'], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 1 and 'no mmwf config named' in bad.stderr


DET = """_base_ = './cascade_wf_t_demo.py'
# our own task: three shape classes, trained from scratch, one iteration on CPU (Table 4's model at 128 x 128)
data_root = '{data}/coco/'
metainfo = dict(classes=('circle', 'square', 'triangle'))
model = dict(
    backbone=dict(init_cfg=None),
    roi_head=dict(bbox_head=[dict(head, num_classes=3) for head in _base_.model.roi_head.bbox_head],
                  mask_head=dict(num_classes=3)))
dataset = dict(data_root=data_root, metainfo=metainfo)
train_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
                        dataset=dict(dataset, ann_file='annotations/instances_train.json',
                                     data_prefix=dict(img='train/')))
val_dataloader = dict(num_workers=0, persistent_workers=False,
                      dataset=dict(dataset, ann_file='annotations/instances_val.json', data_prefix=dict(img='val/'),
                                   indices=1))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
optim_wrapper = dict(type='OptimWrapper')  # fp32 on CPU
train_cfg = dict(max_iters=1, val_interval=1)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=1)]
"""

SEG = """_base_ = './upernet_wf_t_demo.py'
# our own task: four classes, trained from scratch, one iteration (Table 5's model at 96 x 96)
image_size = (96, 96)
data_root = '{data}/ade'
metainfo = dict(classes=('background', 'circle', 'square', 'triangle'),
                palette=[[120, 120, 120], [220, 20, 60], [0, 130, 200], [255, 200, 0]])
model = dict(backbone=dict(init_cfg=None), decode_head=dict(num_classes=4), auxiliary_head=dict(num_classes=4))
dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo, img_suffix='.jpg',
               seg_map_suffix='.png', reduce_zero_label=True)
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(dataset, data_prefix=dict(img_path='images/training',
                                                               seg_map_path='annotations/training')))
val_dataloader = dict(num_workers=0, persistent_workers=False,
                      dataset=dict(dataset, data_prefix=dict(img_path='images/validation',
                                                             seg_map_path='annotations/validation'), indices=1))
test_dataloader = val_dataloader
train_cfg = dict(max_iters=1, val_interval=1)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=1)]
"""


@pytest.mark.slow
def test_a_project_of_its_own_inherits_exported_configs_and_trains(demo_data, tmp_path):
    """Outside the repository: export one detection and one segmentation config (the paper's models at the demo's
    128 x 128, to keep the CPU step short), inherit and change them, and train each for one iteration with the
    train.py that ships in mmdet's / mmseg's wheels."""
    data, project = demo_data, tmp_path / 'project'
    env = dict(os.environ, OMP_NUM_THREADS='1')

    def run(*args):
        res = subprocess.run([sys.executable, *args], cwd=project, capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return res.stdout + res.stderr

    project.mkdir()
    run('-m', 'mmwf.configs', 'cascade_wf_t_demo', 'upernet_wf_t_demo', '--dest', 'configs')
    (project / 'configs/my_det.py').write_text(DET.format(data=data))
    (project / 'configs/my_seg.py').write_text(SEG.format(data=data))
    for scope, config in (('mmdet', 'my_det'), ('mmseg', 'my_seg')):
        module = __import__(scope)
        train = Path(module.__file__).parent / '.mim/tools/train.py'
        # a smaller size, by option (detection) or in the child config (segmentation): mmdet's and mmseg's tools
        # build the runner the configs name, which applies it to every field that follows it
        options = ['--cfg-options', 'image_size=96'] if scope == 'mmdet' else []
        log = run(str(train), f'configs/{config}.py', '--work-dir', f'work_dirs/{config}', *options)
        assert 'Saving checkpoint at 1 iterations' in log
        ran = Config.fromfile(str(project / f'work_dirs/{config}/{config}.py'))  # the config the run dumped
        crops = [t.crop_size for t in ran.train_dataloader.dataset.pipeline if t.type == 'RandomCrop']
        assert ran.image_size == (96, 96) and crops == [(96, 96)]
        assert (ran.model.data_preprocessor.get('pad_size_divisor') or ran.model.data_preprocessor.size[0]) == 96
        cfg = Config.fromfile(str(project / f'configs/{config}.py'))
        heads = cfg.model.roi_head.bbox_head if scope == 'mmdet' else [cfg.model.decode_head]
        assert {h.num_classes for h in heads} == ({3} if scope == 'mmdet' else {4})
        assert (project / f'work_dirs/{config}/iter_1.pth').is_file()


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
