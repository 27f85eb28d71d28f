"""mmwf.configs.follow_image_size: a changed ``image_size`` reaches every field declared to follow it, nested
transforms and wrapped datasets included, on both sides and in each transform's order; a value set explicitly (an
option, a child config) is kept and said; the run's log, through mmwf's tools and through ``ImageSizeRunner``, lists
what the size did. Expected values are worked out by hand from each config's recipe."""
import argparse
import re
from pathlib import Path

import numpy as np
import pytest
from mmengine.config import Config

import mmwf  # noqa: F401  (registers ImageSizeRunner)
from mmwf.configs import FOLLOWED_KEY, config_file, follow_image_size, take_followed

ROOT = Path(__file__).resolve().parents[1]
KEPT = ('{path}: {old} kept, set explicitly (image_size_fields gives {written} at the size the config was written '
        'for, {new} at image_size); remove the setting to follow image_size')


def tool_config(monkeypatch, *argv):
    """The config as tools/train.py and tools/test.py load it from the command line ``argv``."""
    monkeypatch.syspath_prepend(str(ROOT / 'tools'))  # tools/ is not a package: its scripts import tool_args
    monkeypatch.setenv('LOCAL_RANK', '0')
    import tool_args
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    tool_args.add_runner_args(parser)
    return tool_args.load_tool_config(parser.parse_args([str(a) for a in argv]))


def test_an_option_the_size_would_change_is_kept_and_said(monkeypatch, tmp_path):
    """``--cfg-options image_size=640 model.test_cfg.stride=[320,320]``: the stride given is the run's, not 2/3 of
    640; the log says so and what the size would give (2/3 of 640 = 426.7 -> 426; 341 at the 512 the config was
    written for). Without the stride option it follows."""
    name = config_file('upernet_wf_t_ade20k')
    cfg = tool_config(monkeypatch, name, '--cfg-options', 'image_size=640', 'model.test_cfg.stride=[320,320]',
                      '--work-dir', tmp_path)
    assert cfg.model.test_cfg.stride == [320, 320] and cfg.model.test_cfg.crop_size == (640, 640)
    followed = take_followed(cfg)
    assert FOLLOWED_KEY not in cfg.image_size_fields  # taken: the config a run writes holds none
    lines = [str(f) for f in followed]
    assert lines[0] == 'image_size: (512, 512) -> (640, 640)'
    assert 'model.test_cfg.crop_size: (512, 512) -> (640, 640)' in lines
    assert KEPT.format(path='model.test_cfg.stride', old='[320, 320]', written='(341, 341)', new='(426, 426)') in lines
    assert [f.path for f in followed if f.kept] == ['model.test_cfg.stride']

    plain = tool_config(monkeypatch, name, '--cfg-options', 'image_size=640', '--work-dir', tmp_path)
    assert plain.model.test_cfg.stride == (426, 426)
    assert 'model.test_cfg.stride: (341, 341) -> (426, 426)' in map(str, take_followed(plain))


def test_a_child_configs_own_values_are_kept_and_said(tmp_path):
    """A child config of the UperNet config at 640 with its own test Resize and sliding stride: those stay as the
    child wrote them; the fields it left to its base follow (the validation Resize: (4 W, H) = (2560, 640))."""
    child = tmp_path / 'child.py'
    child.write_text(f"_base_ = '{config_file('upernet_wf_t_ade20k')}'\n"
                     'image_size = (640, 640)\n'
                     'model = dict(test_cfg=dict(stride=(300, 300)))\n'
                     "test_pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(2000, 600), "
                     "keep_ratio=True), dict(type='LoadAnnotations', reduce_zero_label=True), "
                     "dict(type='PackSegInputs')]\n"
                     'test_dataloader = dict(dataset=dict(pipeline=test_pipeline))\n')
    cfg = Config.fromfile(str(child))
    followed = follow_image_size(cfg)
    assert cfg.model.test_cfg.stride == (300, 300)
    assert cfg.test_dataloader.dataset.pipeline[1].scale == (2000, 600) == cfg.test_pipeline[1].scale
    assert cfg.val_dataloader.dataset.pipeline[1].scale == (2560, 640)
    assert [t.crop_size for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RandomCrop'] == [(640, 640)]
    kept = {f.path: (f.old, f.written, f.new) for f in followed if f.kept}
    assert kept == {'model.test_cfg.stride': ((300, 300), (341, 341), (426, 426)),
                    'test_pipeline[1].scale': ((2000, 600), (2048, 512), (2560, 640)),
                    'test_dataloader.dataset.pipeline[1].scale': ((2000, 600), (2048, 512), (2560, 640))}
    assert KEPT.format(path='test_pipeline[1].scale', old='(2000, 600)', written='(2048, 512)',
                       new='(2560, 640)') in map(str, followed)


def resize(**kwargs):
    return dict(type='Resize', scale=(200, 100), keep_ratio=True, **kwargs)  # (w, h) of image_size (100, 200)


def test_nested_transforms_and_wrapped_datasets_follow():
    """Resize inside RandomChoice (a list of lists), RandomApply (a list, or one transform), TestTimeAug (a list of
    lists), in datasets inside ConcatDataset, RepeatDataset, ClassBalancedDataset and MultiImageMixDataset (its own
    pipeline and its dataset's): each follows (80, 60) = (W, H) of image_size (60, 80). A TestTimeAug scale the
    factors do not give at the written size (a second scale) is kept; a Resize by scale_factor has no scale. A dict
    two dataloaders share is said once."""
    cfg = Config(dict(
        default_scope='mmdet', image_size=(60, 80),
        image_size_fields=dict(written_for=(100, 200), fields={'pipelines[Resize].scale': (1, 1)}),
        train_dataloader=dict(dataset=dict(type='ConcatDataset', datasets=[
            dict(type='RepeatDataset', times=2, dataset=dict(type='CocoDataset', pipeline=[resize()])),
            dict(type='ClassBalancedDataset', oversample_thr=0.1, dataset=dict(type='CocoDataset', pipeline=[
                dict(type='RandomChoice', transforms=[[resize()], [dict(type='RandomApply', transforms=[resize()])]]),
                dict(type='RandomApply', transforms=resize()),
                dict(type='Resize', scale_factor=0.5)]))])),
        val_dataloader=dict(dataset=dict(type='MultiImageMixDataset', pipeline=[resize()],
                                          dataset=dict(type='CocoDataset', pipeline=[resize()]))),
        tta_pipeline=[dict(type='LoadImageFromFile'), dict(type='TestTimeAug', transforms=[
            [resize(), dict(resize(), scale=(400, 200))], [dict(type='RandomFlip', prob=1.0)]])]))
    cfg.test_dataloader = cfg.val_dataloader  # one dict reached twice: set and said once
    followed = follow_image_size(cfg)
    concat = 'train_dataloader.dataset.datasets'
    assert {f.path: (f.old, f.new) for f in followed[1:] if not f.kept} == {path: ((200, 100), (80, 60)) for path in (
        f'{concat}[0].dataset.pipeline[0].scale',
        f'{concat}[1].dataset.pipeline[0].transforms[0][0].scale',
        f'{concat}[1].dataset.pipeline[0].transforms[1][0].transforms[0].scale',
        f'{concat}[1].dataset.pipeline[1].transforms.scale',
        'val_dataloader.dataset.pipeline[0].scale',
        'val_dataloader.dataset.dataset.pipeline[0].scale',
        'tta_pipeline[1].transforms[0][0].scale')}
    assert [(f.path, f.old) for f in followed if f.kept] == [('tta_pipeline[1].transforms[0][1].scale', (400, 200))]
    balanced = cfg.train_dataloader.dataset.datasets[1].dataset.pipeline
    assert balanced[0].transforms[1][0].transforms[0].scale == (80, 60) and 'scale' not in balanced[2]
    assert cfg.tta_pipeline[1].transforms[0][0].scale == (80, 60) == cfg.test_dataloader.dataset.pipeline[0].scale


def run(scope: str, transforms: list, img: np.ndarray) -> tuple[int, int]:
    """The (H, W) of ``img`` after ``transforms`` as ``scope``'s registry builds them (that scope the default while it
    builds: a registry looks a type up in the current default scope first)."""
    from importlib import import_module

    from mmengine.registry import DefaultScope
    registry = import_module(f'{scope}.registry').TRANSFORMS
    results = dict(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2],
                   gt_seg_map=np.zeros(img.shape[:2], np.uint8))
    with DefaultScope.overwrite_default_scope(scope):
        for t in transforms:
            results = registry.build(t.to_dict() if hasattr(t, 'to_dict') else dict(t))(results)
    return results['img'].shape[:2]


def test_an_imagenet_config_crops_height_by_width():
    """image_size=(224, 320) on an ImageNet config: the training crop is 224 x 320 (RandomResizedCrop lists (h, w)),
    the test resize 256 / 224 of each side, (w, h) = (365, 256) (320 * 256 / 224 = 365.7), and the test crop
    (w, h) = (320, 224): mmpretrain's transforms give 224 x 320 images."""
    cfg = Config.fromfile(str(config_file('weightformer_t_in1k')))
    cfg.merge_from_dict({'image_size': (224, 320)})
    follow_image_size(cfg)
    train, test = cfg.train_dataloader.dataset.pipeline, cfg.test_dataloader.dataset.pipeline
    assert [t.scale for t in train if t.type == 'RandomResizedCrop'] == [(224, 320)]
    assert [(t.type, t.get('scale', t.get('crop_size'))) for t in test[1:3]] == [('Resize', (365, 256)),
                                                                               ('CenterCrop', (320, 224))]
    img = np.zeros((300, 500, 3), np.uint8)
    assert run('mmpretrain', [t for t in train if t.type == 'RandomResizedCrop'], img) == (224, 320)
    assert run('mmpretrain', test[1:3], img) == (224, 320)


def test_a_segmentation_config_follows_height_and_width():
    """image_size=(256, 384) on the UperNet config: the crops and the preprocessor's pad list (h, w); the stride
    is 2/3 of each side, (170, 256); the resizes (mmcv's, (w, h)) are (4 W, H) = (1536, 256); mmseg's RandomCrop
    gives 256 x 384."""
    cfg = Config.fromfile(str(config_file('upernet_wf_t_ade20k')))
    cfg.merge_from_dict({'image_size': (256, 384)})
    follow_image_size(cfg)
    assert cfg.crop_size == cfg.model.data_preprocessor.size == cfg.model.test_cfg.crop_size == (256, 384)
    assert cfg.model.test_cfg.stride == (170, 256)
    train, test = cfg.train_dataloader.dataset.pipeline, cfg.val_dataloader.dataset.pipeline
    by_type = {t.type: t for t in [*train, *test]}
    assert (by_type['RandomResize'].scale, by_type['RandomCrop'].crop_size, by_type['Resize'].scale) == (
        (1536, 256), (256, 384), (1536, 256))
    assert run('mmseg', [by_type['RandomCrop']], np.zeros((600, 900, 3), np.uint8)) == (256, 384)


def test_a_detection_config_takes_a_non_square_size_only_where_its_crop_can():
    """The Cascade configs crop with crop_type='absolute_range', one (min, max) range for both sides: image_size
    (320, 480) is refused by name, the config left as it was. With crop_type='absolute' the crop is (w, h) =
    (480, 320), as are the resizes; the pad divisor (one factor) is H; mmdet's RandomCrop gives 320 x 480."""
    cfg = Config.fromfile(str(config_file('cascade_wf_t_coco')))
    cfg.merge_from_dict({'image_size': (320, 480)})
    with pytest.raises(ValueError, match=re.escape('image_size=(320, 480) reaches train_pipeline[4].crop_size '
                                                   "(pipelines[RandomCrop].crop_size in image_size_fields), a "
                                                   "RandomCrop whose crop_type='absolute_range'")):
        follow_image_size(cfg)
    assert cfg.model.data_preprocessor.pad_size_divisor == 1024 and cfg.train_pipeline[4].crop_size == (1024, 1024)
    for pipeline in (cfg.train_pipeline, cfg.train_dataloader.dataset.pipeline):
        pipeline[4].crop_type = 'absolute'
    follow_image_size(cfg)
    train = cfg.train_dataloader.dataset.pipeline
    assert (train[3].scale, train[4].crop_size, cfg.test_dataloader.dataset.pipeline[1].scale) == (
        (480, 320), (480, 320), (480, 320))
    assert cfg.model.data_preprocessor.pad_size_divisor == 320
    assert run('mmdet', [train[4]], np.zeros((700, 900, 3), np.uint8)) == (320, 480)


def test_an_unchanged_size_does_nothing_and_following_twice_says_it_once():
    cfg = Config.fromfile(str(config_file('cascade_wf_t_demo')))
    assert follow_image_size(cfg) == []
    cfg.merge_from_dict({'image_size': 96})
    assert [str(f) for f in follow_image_size(cfg)][:2] == ['image_size: (128, 128) -> (96, 96)',
                                                            'model.data_preprocessor.pad_size_divisor: 128 -> 96']
    assert follow_image_size(cfg) == []


def test_a_declaration_without_the_size_its_fields_hold_is_refused():
    cfg = Config(dict(image_size=96, image_size_fields=dict(fields={'crop_size': (1, 1)}), crop_size=(128, 128)))
    with pytest.raises(ValueError, match='image_size_fields of the config has no written_for: give the size its '
                                         'fields hold'):
        follow_image_size(cfg)


def log_lines(runner) -> list[str]:
    """The lines of the run's log file in its work folder, without their time stamps."""
    text = (Path(runner.log_dir) / f'{runner.timestamp}.log').read_text()
    return [line.split(' - ', 2)[-1] for line in text.splitlines()]


def expect_logged(lines: list[str]) -> None:
    """What image_size=96 with the test CenterCrop set to 100 does to the classification demo (written for 128; the
    test resize 256 / 224 of the size: 146 -> 109), each said once, the kept value as a warning."""
    for line in ('INFO - image_size: (128, 128) -> (96, 96)',
                 'INFO - test_dataloader.dataset.pipeline[1].scale: (146, 146) -> (109, 109)',
                 'INFO - train_dataloader.dataset.pipeline[1].scale: 128 -> 96',
                 'WARNING - ' + KEPT.format(path='test_dataloader.dataset.pipeline[2].crop_size', old=100,
                                            written=128, new=96)):
        assert lines.count(line) == 1, (line, lines[-20:])


def test_image_size_runner_logs_what_the_size_did(tmp_path):
    """Another project's tools (mmpretrain's train.py) build the runner the config names: ImageSizeRunner follows
    the size and writes each field to the work folder's log file."""
    from mmengine.registry import RUNNERS
    cfg = Config.fromfile(str(config_file('weightformer_t_cls_demo')))
    cfg.merge_from_dict({'image_size': 96, 'test_dataloader.dataset.pipeline.2.crop_size': 100,
                         'work_dir': str(tmp_path), 'experiment_name': f'image_size_runner_{tmp_path.name}'})
    runner = RUNNERS.build(cfg)
    expect_logged(log_lines(runner))
    assert runner.cfg.test_dataloader.dataset.pipeline[2].crop_size == 100
    assert runner.cfg.val_dataloader.dataset.pipeline[2].crop_size == 96


def test_mmwfs_tools_log_what_the_size_did(monkeypatch, tmp_path, demo_data):
    """tools/train.py and tools/test.py: the size is followed when the config is loaded, before the runner and its
    log exist; build_runner writes the lines to the run's log file once."""
    from mmwf.engine.launch import build_runner
    cfg = tool_config(monkeypatch, config_file('weightformer_t_cls_demo'), '--cfg-options', 'image_size=96',
                      'test_dataloader.dataset.pipeline.2.crop_size=100',
                      f'test_dataloader.dataset.data_root={demo_data / "cls"}',
                      f'experiment_name=image_size_tools_{tmp_path.name}', '--work-dir', tmp_path)
    runner = build_runner(cfg, ('test',))
    expect_logged(log_lines(runner))
