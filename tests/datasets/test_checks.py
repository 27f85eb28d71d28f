"""Dataset checks on data that fits: nothing raised, steps inserted once, heads found. (Their errors are cases of
tests/test_bad_inputs.py.)"""
from types import SimpleNamespace

import numpy as np
import torch.nn as nn

from mmwf.datasets import CheckAnnotations, check_classes, head_class_counts, insert_annotation_checks


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
    classes = ('circle', 'square')
    data = {s: SimpleNamespace(metainfo=dict(classes=classes), ann_file=f'{s}.json') for s in ('train', 'val')}
    model = nn.Module()
    model.decode_head = Head(2)
    check_classes(data, model, checkpoint=('iter_4.pth', list(classes)))


def test_annotation_checks_are_inserted_once_after_every_load_annotations():
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations'), dict(type='PackSegInputs')]
    cfg = dict(train_dataloader=dict(dataset=dict(type='RepeatDataset', dataset=dict(pipeline=pipeline))),
               val_dataloader=dict(dataset=dict(pipeline=[dict(type='LoadAnnotations')])))
    assert insert_annotation_checks(cfg) == 2
    assert insert_annotation_checks(cfg) == 0
    assert [t['type'] for t in pipeline] == ['LoadImageFromFile', 'LoadAnnotations', 'CheckAnnotations',
                                             'PackSegInputs']


def test_fitting_annotations_pass_through_unchanged():
    seg = np.array([[0, 1], [3, 255]], np.uint8)
    results = dict(ori_shape=(2, 2), gt_seg_map=seg, img_path='a.jpg', seg_map_path='a.png', height=2, width=2)
    assert CheckAnnotations(num_classes=4)(results) is results
