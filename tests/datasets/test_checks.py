"""Dataset checks on data that fits: nothing raised (and the nearest data that does not fit refused by the same
call), steps inserted once, heads found. (More of their errors are cases of tests/test_bad_inputs.py.)"""
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch.nn as nn

from mmwf.datasets import CheckAnnotations, check_classes, configure_annotation_checks, head_class_counts


class Head(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.num_classes = num_classes


def test_head_class_counts_finds_class_aware_heads_only():
    model = nn.Module()
    model.rpn_head = Head(1)  # class-agnostic
    model.roi_head = nn.Module()
    model.roi_head.bbox_head = nn.ModuleList([Head(80), Head(80)])
    model.roi_head.mask_head = Head(80)
    classifier = nn.Module()
    classifier.out_type, classifier.head = 'logits', nn.Linear(4, 1000)
    model.backbone = classifier
    assert head_class_counts(model) == {'roi_head.bbox_head.0': 80, 'roi_head.bbox_head.1': 80,
                                        'roi_head.mask_head': 80, 'backbone.head': 1000}


def test_matching_splits_and_heads_pass():
    """Matching classes pass; the same call with one class off in a split, a head or the checkpoint raises, naming
    it."""
    classes = ('circle', 'square')

    def splits(val_classes=classes):
        return {s: SimpleNamespace(metainfo=dict(classes=c), ann_file=f'{s}.json')
                for s, c in (('train', classes), ('val', val_classes))}

    def model(n=2):
        m = nn.Module()
        m.decode_head = Head(n)
        return m
    assert check_classes(splits(), model(), checkpoint=('iter_4.pth', list(classes))) == []
    with pytest.raises(ValueError, match=re.escape('the train dataset (train.json: 2) and the val dataset (val.json: '
                                                   '3) differ')) as err:
        check_classes(splits(classes + ('triangle',)), model(), checkpoint=('iter_4.pth', list(classes)))
    assert 'only in the val dataset: triangle' in str(err.value)
    with pytest.raises(ValueError, match=re.escape('the same names in another order (label 0: circle vs square')):
        check_classes(splits(classes[::-1]), model())
    with pytest.raises(ValueError, match=re.escape('the train dataset (train.json) has 2 classes (circle, square) '
                                                   'but decode_head has num_classes=3')):
        check_classes(splits(), model(3), checkpoint=('iter_4.pth', list(classes)))
    with pytest.raises(ValueError, match=re.escape("checkpoint 'iter_4.pth' (the classes it was trained on: 3)")
                       ) as err:
        check_classes(splits(), model(), checkpoint=('iter_4.pth', list(classes) + ['triangle']))
    assert "only in checkpoint 'iter_4.pth': triangle" in str(err.value)


def test_annotation_checks_are_inserted_once_after_every_load_annotations_of_a_built_dataset():
    """As DatasetCheckHook does when a run starts: inside a dataset wrapper, with the dataset's class count."""
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope
    from mmseg.datasets.transforms import LoadAnnotations
    init_default_scope('mmseg')
    inner = SimpleNamespace(metainfo=dict(classes=('a', 'b', 'c')), pipeline=Compose(
        [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'), dict(type='PackSegInputs')]))
    wrapper = SimpleNamespace(metainfo=inner.metainfo, dataset=inner)
    assert configure_annotation_checks(wrapper, ignore_index=0) == 1
    assert configure_annotation_checks(wrapper) == 0
    steps = inner.pipeline.transforms
    assert [type(t).__name__ for t in steps] == ['LoadImageFromFile', 'LoadAnnotations', 'CheckAnnotations',
                                                 'PackSegInputs']
    assert isinstance(steps[1], LoadAnnotations) and (steps[2].num_classes, steps[2].ignore_index) == (3, 0)


def test_fitting_annotations_pass_through_unchanged():
    """A fitting mmseg sample (values up to num_classes - 1 and the ignore index, sizes that agree) comes back as it
    went in; one label value, the image size or the annotated size one off is refused by the same check."""
    seg = np.array([[0, 1], [3, 255]], np.uint8)
    fitting = dict(ori_shape=(2, 2), gt_seg_map=seg, img_path='a.jpg', seg_map_path='a.png', height=2, width=2,
                   reduce_zero_label=False)
    check = CheckAnnotations(num_classes=4)
    out = check(fitting)
    assert out is fitting and sorted(out) == ['gt_seg_map', 'height', 'img_path', 'ori_shape', 'reduce_zero_label',
                                              'seg_map_path', 'width']
    assert out['gt_seg_map'] is seg and out['gt_seg_map'].dtype == np.uint8
    assert out['gt_seg_map'].tolist() == [[0, 1], [3, 255]]
    assert (out['ori_shape'], out['height'], out['width'], out['img_path'], out['seg_map_path'],
            out['reduce_zero_label']) == ((2, 2), 2, 2, 'a.jpg', 'a.png', False)
    with pytest.raises(ValueError, match=re.escape("label map 'a.png' holds class values [4] but the dataset has 4 "
                                                   'classes')):
        check(dict(fitting, gt_seg_map=np.array([[0, 1], [4, 255]], np.uint8)))
    with pytest.raises(ValueError, match=re.escape("label map 'a.png' is 2 x 2 (W x H) but its image 'a.jpg' is "
                                                   '2 x 3')):
        check(dict(fitting, ori_shape=(3, 2), height=3))
    with pytest.raises(ValueError, match=re.escape("image 'a.jpg' is 2 x 2 (W x H) but its annotation file gives "
                                                   '2 x 3')):
        check(dict(fitting, height=3))
    assert seg.tolist() == [[0, 1], [3, 255]]  # the refused variants were copies


def test_an_allowed_remapping_is_returned_to_be_logged_and_a_type_without_classes_keeps_its_labels():
    from mmseg.datasets import ADE20KDataset, BaseSegDataset
    prefix = dict(img_path='i', seg_map_path='a')
    ade = ADE20KDataset(data_root='data/ade', data_prefix=prefix, lazy_init=True,
                        metainfo=dict(classes=('floor', 'wall')))
    lines = check_classes({'train': ade}, nn.Module(), remap=True)
    assert len(lines) == 1 and lines[0].startswith('the train dataset: ADE20KDataset') and '3 (floor) -> 0' in lines[0]
    plain = BaseSegDataset(data_root='data/own', data_prefix=prefix, lazy_init=True,
                           metainfo=dict(classes=('floor', 'wall')))
    assert check_classes({'train': plain}, nn.Module()) == []
