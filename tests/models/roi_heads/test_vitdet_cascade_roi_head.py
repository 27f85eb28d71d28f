"""ViTDetCascadeRoIHead behaves as detectron2's CascadeROIHeads (cascade_rcnn.py)."""
import copy
import math
from pathlib import Path

import pytest
import torch
from mmdet.models.roi_heads import CascadeRoIHead
from mmdet.models.roi_heads.mask_heads import FCNMaskHead
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.structures.mask import BitmapMasks
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.structures import InstanceData

import mmwf  # noqa: F401
from mmwf.models.roi_heads import ViTDetCascadeRoIHead

ROOT = Path(__file__).resolve().parents[3]
SIZE = 128


def head_config(num_classes: int = 3) -> dict:
    """The roi_head of configs/cascade_wf_t_coco.py with its train / test configs, ``num_classes`` classes."""
    cfg = Config.fromfile(str(ROOT / 'configs/cascade_wf_t_coco.py'))
    roi = copy.deepcopy(cfg.model.roi_head)
    for head in roi.bbox_head:
        head.num_classes = num_classes
    roi.mask_head.num_classes = num_classes
    return dict(roi, train_cfg=cfg.model.train_cfg.rcnn, test_cfg=cfg.model.test_cfg.rcnn)


def build(cfg: dict):
    init_default_scope('mmdet')
    return MODELS.build(cfg)


def features(batch: int = 2) -> tuple[torch.Tensor, ...]:
    """Pyramid levels P2-P6 of ``batch`` images of SIZE x SIZE."""
    return tuple(torch.randn(batch, 256, SIZE // s, SIZE // s, requires_grad=True) for s in (4, 8, 16, 32, 64))


def samples(batch: int = 2) -> list[DetDataSample]:
    out = []
    for i in range(batch):
        s = DetDataSample(metainfo=dict(img_shape=(SIZE, SIZE), ori_shape=(SIZE, SIZE), pad_shape=(SIZE, SIZE),
                                        batch_input_shape=(SIZE, SIZE), scale_factor=(1.0, 1.0)))
        boxes = torch.tensor([[10.0, 12.0, 60.0, 70.0], [70.0, 20.0, 120.0, 90.0]]) + i
        masks = torch.zeros(2, SIZE, SIZE, dtype=torch.uint8)
        for m, (x0, y0, x1, y1) in zip(masks, boxes.long().tolist()):
            m[y0:y1, x0:x1] = 1
        s.gt_instances = InstanceData(bboxes=boxes, labels=torch.tensor([0, 2]),
                                      masks=BitmapMasks(masks.numpy(), SIZE, SIZE))
        out.append(s)
    return out


def proposals(batch: int = 2, n: int = 40) -> list[InstanceData]:
    out = []
    for _ in range(batch):
        xy = torch.rand(n, 2) * (SIZE - 40)
        boxes = torch.cat([xy, xy + 8 + torch.rand(n, 2) * 30], 1)
        out.append(InstanceData(bboxes=boxes, scores=torch.rand(n), labels=torch.zeros(n, dtype=torch.long)))
    return out


def test_one_mask_head_trained_once_and_run_once():
    head = build(head_config()).train()
    assert isinstance(head.mask_head, FCNMaskHead)
    assert sum(isinstance(m, FCNMaskHead) for m in head.modules()) == 1
    calls = []
    head.mask_head.register_forward_hook(lambda m, i, o: calls.append(o.shape[0]))
    losses = head.loss(features(), proposals(), samples())
    assert 'loss_mask' in losses and not [k for k in losses if k.startswith('s') and 'mask' in k]
    assert {f's{k}.{n}' for k in range(3) for n in ('loss_cls', 'loss_bbox')} <= losses.keys()
    assert len(calls) == 1 and calls[0] > 0  # the first stage's positives only
    head.eval()
    calls.clear()
    with torch.no_grad():
        results = head.predict(features(), proposals(), samples())
    assert len(calls) == 1 and calls[0] == sum(len(r) for r in results)
    assert all(r.masks.shape[-2:] == (SIZE, SIZE) for r in results)


def decode(boxes: torch.Tensor, deltas: torch.Tensor, stage: int) -> torch.Tensor:
    """detectron2's Box2BoxTransform.apply_deltas with the stage's weights (1 / the config's target_stds), then
    clipped to the SIZE x SIZE image, written out from the formulas."""
    stds = torch.tensor(head_config()['bbox_head'][stage]['bbox_coder']['target_stds'])
    d = deltas * stds
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    cx, cy = boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h
    cx, cy = cx + d[:, 0] * w, cy + d[:, 1] * h
    clamp = math.log(1000.0 / 16)
    w, h = w * d[:, 2].clamp(max=clamp).exp(), h * d[:, 3].clamp(max=clamp).exp()
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1).clamp(0, SIZE)


def record_stages(head):
    """Make ``head.bbox_loss`` record (sampling results, box results) of every stage."""
    seen = []
    bbox_loss = head.bbox_loss

    def recording(stage, x, sampling_results):
        results = bbox_loss(stage, x, sampling_results)
        seen.append((sampling_results, results))
        return results

    head.bbox_loss = recording
    return seen


def sorted_rows(boxes: torch.Tensor) -> torch.Tensor:
    return boxes[torch.argsort(boxes[:, 0] * 1e6 + boxes[:, 1] * 1e3 + boxes[:, 2])]


def test_later_stages_take_every_box_of_the_previous_stage():
    """Stage k > 0 trains on every box stage k - 1 regressed (clipped, empty ones dropped, ground-truth proposals
    included), detached, without sampling or ground truth added."""
    head = build(head_config()).train()
    seen = record_stages(head)
    head.loss(features(), proposals(), samples())
    assert len(seen) == 3
    # 40 proposals + 2 ground-truth boxes per image, all sampled in the first stage (fewer than 512)
    assert [len(r.priors) for r in seen[0][0]] == [42, 42] and [int(r.pos_is_gt.sum()) for r in seen[0][0]] == [2, 2]
    for stage in (1, 2):
        previous, (current, _) = seen[stage - 1], seen[stage]
        preds = previous[1]['bbox_pred'].split([len(r.priors) for r in previous[0]])
        for res, pred, now in zip(previous[0], preds, current):
            expected = decode(res.priors, pred, stage - 1)
            expected = expected[((expected[:, 2:] - expected[:, :2]) > 0).all(1)]
            assert expected.min() >= 0 and expected.max() <= SIZE  # clipped to the image
            torch.testing.assert_close(sorted_rows(now.priors), sorted_rows(expected.detach()))
            assert not now.priors.requires_grad and int(now.pos_is_gt.sum()) == 0


def test_an_image_without_ground_truth_trains():
    head = build(head_config()).train()
    batch = samples()
    batch[1].gt_instances = InstanceData(bboxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long),
                                         masks=BitmapMasks(torch.zeros(0, SIZE, SIZE).numpy(), SIZE, SIZE))
    losses = head.loss(features(), proposals(), batch)
    assert all(torch.isfinite(v).all() for k, v in losses.items() if 'loss' in k)
    assert {'s2.loss_cls', 's2.loss_bbox', 'loss_mask'} <= losses.keys()


def test_stage_gradient_is_scaled_by_one_over_num_stages():
    """The RoI features entering a box head carry 1/3 of the gradient in training; head parameters get all of it."""
    head = build(head_config())
    rois = torch.tensor([[0, 10.0, 12.0, 60.0, 70.0], [1, 70.0, 20.0, 120.0, 90.0]])
    grads, levels = {}, features()
    for mode in ('train', 'eval'):
        getattr(head, mode)()
        head.zero_grad()
        x = tuple(level.detach().clone().requires_grad_() for level in levels)
        out = head._bbox_forward(1, x, rois)
        (out['cls_score'].square().sum() + out['bbox_pred'].sum()).backward()
        # the box RoIs are pooled from P2-P5
        grads[mode] = ([level.grad.clone() for level in x[:4]], head.bbox_head[1].fc_cls.weight.grad.clone())
    (x_train, w_train), (x_eval, w_eval) = grads['train'], grads['eval']
    assert any(g.abs().sum() > 0 for g in x_eval)
    for g_train, g_eval in zip(x_train, x_eval):
        torch.testing.assert_close(g_train, g_eval / 3)
    torch.testing.assert_close(w_train, w_eval)


def test_test_time_scores_average_the_stages_probabilities():
    head = build(head_config()).eval()
    x, props = features(), proposals()
    metas = [s.metainfo for s in samples()]
    num = tuple(len(p) for p in props)
    rois = torch.cat([torch.cat([torch.full((len(p), 1), float(i)), p.bboxes], 1) for i, p in enumerate(props)])
    with torch.no_grad():
        _, log_probs, _ = head._refine_roi(x, rois, metas, num)
        expected, stage_rois = 0, rois
        for stage in range(3):
            out = head._bbox_forward(stage, x, stage_rois)
            expected = expected + out['cls_score'].softmax(-1) / 3
            if stage < 2:
                stage_rois = torch.cat([stage_rois[:, :1], decode(stage_rois[:, 1:], out['bbox_pred'], stage)], 1)
        logits_mean = CascadeRoIHead._refine_roi(head, x, rois, metas, num)[1]
    torch.testing.assert_close(torch.cat(log_probs).exp(), expected)
    assert not torch.allclose(torch.cat(logits_mean).softmax(-1), expected)  # mmdet's average of logits differs


def test_an_image_without_proposals_and_images_without_surviving_boxes():
    """Training and testing go on when an image has no proposals (training: its ground truth is its only proposal),
    and testing gives empty results (masks of the image's size) when no box passes the score threshold."""
    empty = InstanceData(bboxes=torch.zeros(0, 4), scores=torch.zeros(0), labels=torch.zeros(0, dtype=torch.long))
    head = build(head_config()).train()
    seen = record_stages(head)
    losses = head.loss(features(), [proposals(1)[0], empty], samples())
    assert all(torch.isfinite(v).all() for k, v in losses.items() if 'loss' in k)
    assert [len(r.priors) for r in seen[0][0]] == [42, 2]  # the empty image: its two ground-truth boxes
    head.eval()
    with torch.no_grad():
        results = head.predict(features(), [proposals(1)[0], empty], samples())
        assert len(results[0]) > 0 and len(results[1]) == 0
        assert results[1].masks.shape == (0, SIZE, SIZE) and results[1].bboxes.shape == (0, 4)
        head.test_cfg.score_thr = 1.1  # no box survives
        results = head.predict(features(), proposals(), samples())
    assert [len(r) for r in results] == [0, 0]
    assert all(r.masks.shape == (0, SIZE, SIZE) and r.labels.shape == (0,) for r in results)


def test_a_configuration_that_is_not_the_vitdet_cascade_is_refused():
    cfg = head_config()
    cfg['train_cfg'][1]['sampler'] = dict(type='RandomSampler', num=512, pos_fraction=0.25)
    with pytest.raises(ValueError, match=r"rcnn\[1\].sampler is RandomSampler.*PseudoSampler"):
        build(cfg)
    cfg = head_config()
    cfg['mask_head'] = [cfg['mask_head']] * 3
    with pytest.raises(ValueError, match='one mask head'):
        build(cfg)
    cfg = head_config()
    cfg['bbox_head'][2]['reg_class_agnostic'] = False
    with pytest.raises(ValueError, match=r'bbox_head\[2\] must regress class-agnostic'):
        build(cfg)
    with pytest.raises(ValueError, match='one weight per stage'):
        build(dict(head_config(), stage_loss_weights=[1.0, 1.0]))
    assert isinstance(build(head_config()), ViTDetCascadeRoIHead)
