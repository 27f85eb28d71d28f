"""The ViTDet Cascade Mask R-CNN deployed end to end: one ONNX graph from the padded image to boxes, scores, labels
and mask probabilities, run by ONNX Runtime, with mmdet's own steps around it.

The graph (:class:`CascadeMaskRCNNGraph`) computes what mmdet's ``TwoStageDetector.predict`` computes on one image,
step by step in tensors: the RPN's top-k per level, decoding and level-wise NMS; each cascade stage's RoIAlign on the
level of the RoI's scale, box head and class-agnostic regression; the stages' averaged class probabilities; the
per-class NMS; the mask head on the detections. NMS and RoIAlign are ONNX's ``NonMaxSuppression`` and ``RoiAlign``
(torchvision's operators, which the TorchScript exporter lowers to them), so no custom operator library is needed.
Outside the graph (:class:`DetectorSession`): mmdet's test pipeline and data preprocessor before (resize, normalise,
pad), and after, the boxes rescaled to the original image and each box's 28 x 28 mask pasted into it by mmdet's
``_do_paste_mask``, as ``FCNMaskHead`` does.
"""
from __future__ import annotations

import math
import os
import warnings

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from mmwf.deployment.onnx import OPSET, ImageSession, graph_metadata, write_metadata


def decode_deltas(priors: Tensor, deltas: Tensor, coder: nn.Module, img_shape: Tensor) -> Tensor:
    """mmdet's ``DeltaXYWHBBoxCoder.decode`` (``delta2bbox``) of ``deltas`` (n, 4) on ``priors`` (n, 4), boxes clipped
    to ``img_shape`` (2,) = (h, w), which may be a graph input."""
    d = deltas * deltas.new_tensor(coder.stds) + deltas.new_tensor(coder.means)
    pxy = (priors[:, :2] + priors[:, 2:]) * 0.5
    pwh = priors[:, 2:] - priors[:, :2]
    max_ratio = abs(math.log(16 / 1000))  # the coder's default wh_ratio_clip
    gxy = pxy + pwh * d[:, :2]
    gwh = pwh * d[:, 2:].clamp(min=-max_ratio, max=max_ratio).exp()
    boxes = torch.cat([gxy - gwh * 0.5, gxy + gwh * 0.5], -1)
    return torch.minimum(boxes.clamp(min=0), img_shape.flip(0).repeat(2).to(boxes.dtype))


def batched_nms(boxes: Tensor, scores: Tensor, groups: Tensor, iou_threshold: float) -> Tensor:
    """Indices kept by NMS within each group, by descending score: mmcv's ``batched_nms`` (boxes of a group shifted
    by the group's index times the largest coordinate + 1). Boxes are clipped (non-negative), so the appended 0
    leaves the largest coordinate unchanged and an empty set valid."""
    from torchvision.ops import nms
    max_coordinate = torch.cat([boxes.reshape(-1), boxes.new_zeros(1)]).max()
    return nms(boxes + (groups.to(boxes) * (max_coordinate + 1))[:, None], scores, iou_threshold)


def rois_of(boxes: Tensor) -> Tensor:
    """(n, 4) boxes of image 0 -> (n, 5) RoIs (batch index first), as ``bbox2roi``. A pad, not a concat: ONNX
    Runtime's Concat drops an input of no rows, which would leave no boxes with 4 columns."""
    return nn.functional.pad(boxes, (1, 0))


def roi_features(extractor: nn.Module, feats: tuple[Tensor, ...], rois: Tensor) -> Tensor:
    """mmdet's ``SingleRoIExtractor``: each RoI (n, 5) aligned from the pyramid level of its scale -> (n, C, S, S)."""
    from torchvision.ops import roi_align
    levels = extractor.map_roi_levels(rois, len(extractor.roi_layers))
    inds, pooled = [], []
    for i, layer in enumerate(extractor.roi_layers):
        inds.append((levels == i).nonzero().squeeze(1))
        pooled.append(roi_align(feats[i], rois[inds[-1]], layer.output_size, layer.spatial_scale,
                                layer.sampling_ratio, layer.aligned))
    # back to the RoIs' order by a gather (an indexed assignment would keep the traced count of each level)
    return torch.cat(pooled)[torch.cat(inds).argsort()]


class CascadeMaskRCNNGraph(nn.Module):
    """mmdet's two-stage inference of a ViTDet Cascade Mask R-CNN (``ViTDetCascadeRoIHead``) on one image, in
    tensors only, for the TorchScript ONNX exporter (``torch.onnx.export(dynamo=False)``): the number of proposals
    and detections depends on the image.

    Args:
        model (nn.Module): the mmdet detector (eval mode): an RPN head with sigmoid scores and a
            ``ViTDetCascadeRoIHead`` with class-agnostic box heads, mmcv ``RoIAlign`` extractors (average pooling)
            and ``nms`` in both test configs.

    ``forward(image, img_shape)``: ``image`` (1, 3, H, W) the normalised, padded image, ``img_shape`` (2,) float,
    (h, w) of the image inside the padding -> ``boxes`` (n, 4) in input pixels, ``scores`` (n,), ``labels`` (n,)
    int64, ``masks`` (n, S, S) the mask probabilities of each box's class (S = 28), n <= ``max_per_img``, by
    descending score.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        from mmwf.models.roi_heads import ViTDetCascadeRoIHead
        roi_head = getattr(model, 'roi_head', None)
        if type(roi_head) is not ViTDetCascadeRoIHead or not roi_head.with_mask:
            raise ValueError(f'{type(model).__name__} has roi_head {type(roi_head).__name__}: the end-to-end graph '
                             "is the ViTDet Cascade Mask R-CNN's (ViTDetCascadeRoIHead with a mask head); export "
                             "another detector's backbone + neck (tools/deployment/pytorch2onnx.py without --end2end)")
        if model.training:
            raise ValueError(f'{type(model).__name__} is in training mode: call .eval() before exporting')
        rpn, rcnn = model.rpn_head.test_cfg, roi_head.test_cfg
        checks = {'rpn_head.use_sigmoid_cls': model.rpn_head.use_sigmoid_cls,
                  'test_cfg.rpn.nms': dict(rpn.nms) == dict(type='nms', iou_threshold=rpn.nms.iou_threshold),
                  'test_cfg.rcnn.nms': dict(rcnn.nms) == dict(type='nms', iou_threshold=rcnn.nms.iou_threshold)}
        coders = [model.rpn_head.bbox_coder] + [head.bbox_coder for head in roi_head.bbox_head]
        for i, coder in enumerate(coders):
            checks[f'bbox coder {i}: DeltaXYWHBBoxCoder clipping, without centre clamp'] = (
                type(coder).__name__ == 'DeltaXYWHBBoxCoder' and coder.clip_border and not coder.add_ctr_clamp)
        for name, ext in [('mask_roi_extractor', roi_head.mask_roi_extractor),
                          *((f'bbox_roi_extractor[{i}]', e) for i, e in enumerate(roi_head.bbox_roi_extractor))]:
            checks[f'{name}: RoIAlign, average pooling'] = all(
                type(layer).__name__ == 'RoIAlign' and layer.pool_mode == 'avg' for layer in ext.roi_layers)
        failed = [name for name, ok in checks.items() if not ok]
        if failed:
            raise ValueError(f'the end-to-end graph computes mmdet\'s ViTDet Cascade Mask R-CNN; this model differs '
                             f'in: {", ".join(failed)}')
        self.model = model
        self.eval()  # the exporter restores the mode it found: not a new module's training mode

    def proposals(self, feats: tuple[Tensor, ...], img_shape: Tensor) -> Tensor:
        """RPN proposals (m, 4), as ``RPNHead.predict_by_feat`` with ``rescale=False``."""
        head, cfg = self.model.rpn_head, self.model.rpn_head.test_cfg
        cls_scores, bbox_preds = head(feats)
        priors = head.prior_generator.grid_priors([s.shape[-2:] for s in cls_scores], dtype=feats[0].dtype,
                                                  device=feats[0].device)
        levels, scores, deltas, anchors = [], [], [], []
        for i, (cls, reg, prior) in enumerate(zip(cls_scores, bbox_preds, priors)):
            s = cls[0].permute(1, 2, 0).reshape(-1).sigmoid()
            r = reg[0].permute(1, 2, 0).reshape(-1, 4)
            if 0 < cfg.nms_pre < len(s):
                s, top = s.topk(cfg.nms_pre)
                r, prior = r[top], prior[top]
            levels.append(torch.full((len(s),), i, dtype=torch.long, device=s.device))
            scores.append(s), deltas.append(r), anchors.append(prior)
        boxes = decode_deltas(torch.cat(anchors), torch.cat(deltas), head.bbox_coder, img_shape)
        scores, levels = torch.cat(scores), torch.cat(levels)
        if cfg.get('min_bbox_size', -1) >= 0:
            wh = boxes[:, 2:] - boxes[:, :2]
            valid = ((wh[:, 0] > cfg.min_bbox_size) & (wh[:, 1] > cfg.min_bbox_size)).nonzero().squeeze(1)
            boxes, scores, levels = boxes[valid], scores[valid], levels[valid]
        keep = batched_nms(boxes, scores, levels, cfg.nms.iou_threshold)[:cfg.max_per_img]
        return boxes[keep]

    def forward(self, image: Tensor, img_shape: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        feats = tuple(self.model.extract_feat(image))
        roi_head, cfg = self.model.roi_head, self.model.roi_head.test_cfg
        rois = rois_of(self.proposals(feats, img_shape))
        probs = 0
        for stage in range(roi_head.num_stages):  # ViTDetCascadeRoIHead._refine_roi
            extractor = roi_head.bbox_roi_extractor[stage]
            cls_score, bbox_pred = roi_head.bbox_head[stage](roi_features(extractor, feats, rois))
            probs = probs + cls_score.softmax(-1) / roi_head.num_stages
            boxes = decode_deltas(rois[:, 1:], bbox_pred, roi_head.bbox_head[stage].bbox_coder, img_shape)
            if stage < roi_head.num_stages - 1:
                rois = rois_of(boxes)
        scores = probs.log().softmax(-1)[:, :-1]  # the last box head's predict_by_feat
        num_classes = scores.shape[1]
        # mmdet's multiclass_nms: every (box, class) above the score threshold, NMS per class, the best max_per_img
        cand = (scores.reshape(-1) > cfg.score_thr).nonzero().squeeze(1)
        box_idx, labels = torch.div(cand, num_classes, rounding_mode='floor'), cand % num_classes
        boxes, scores = boxes[box_idx], scores.reshape(-1)[cand]
        keep = batched_nms(boxes, scores, labels, cfg.nms.iou_threshold)[:cfg.max_per_img]
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        mask_logits = roi_head.mask_head(roi_features(roi_head.mask_roi_extractor, feats, rois_of(boxes)))
        size = mask_logits.shape[2:]  # each box's class by GatherElements (fancy indexing fails on no boxes)
        masks = mask_logits.gather(1, labels.view(-1, 1, 1, 1).expand(-1, 1, *size))[:, 0].sigmoid()
        return boxes, scores, labels, masks


def export_detector(model: nn.Module, size: tuple[int, int], out: str, opset: int = OPSET, cfg=None) -> str:
    """Export ``model``'s :class:`CascadeMaskRCNNGraph` at the padded input size ``size`` (H, W) to ``out``, with
    :func:`~mmwf.deployment.onnx.graph_metadata` of its config ``cfg`` when given."""
    graph = CascadeMaskRCNNGraph(model)
    weight = next(model.parameters())
    image = torch.randn(1, 3, *size, dtype=weight.dtype, device=weight.device)
    img_shape = torch.tensor(size, dtype=weight.dtype, device=weight.device)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    # the TorchScript exporter by choice: it traces the counts of proposals and detections into the graph as the
    # outputs of NonZero / NonMaxSuppression, where torch.export would need each data-dependent size declared. The
    # trace keeps the sizes that depend on the input's size only (the size is static); the tests run the graph on
    # images with other counts of boxes, and none
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings('ignore', 'You are using the legacy TorchScript-based ONNX export', DeprecationWarning)
        warnings.filterwarnings('ignore', category=torch.jit.TracerWarning)
        torch.onnx.export(graph, (image, img_shape), out, dynamo=False, opset_version=opset,
                          input_names=['image', 'img_shape'], output_names=['boxes', 'scores', 'labels', 'masks'])
    if cfg is not None:
        write_metadata(out, graph_metadata(cfg, 'detector', size))
    return out


def paste_masks(masks: Tensor, boxes: Tensor, ori_shape: tuple[int, int], threshold: float) -> Tensor:
    """Each (S, S) mask probability map pasted into its box of an image of ``ori_shape`` and binarised: mmdet's
    ``FCNMaskHead`` on the CPU (``_do_paste_mask`` one box at a time, skipping the area outside the box)."""
    from mmdet.models.roi_heads.mask_heads.fcn_mask_head import _do_paste_mask
    im_mask = torch.zeros(len(masks), *ori_shape, dtype=torch.bool)
    for i in range(len(masks)):
        chunk, spatial = _do_paste_mask(masks[i:i + 1, None], boxes[i:i + 1], *ori_shape, skip_empty=True)
        im_mask[(torch.tensor([i]),) + spatial] = chunk >= threshold
    return im_mask


class DetectorSession(ImageSession):
    """An exported :class:`CascadeMaskRCNNGraph` run by ONNX Runtime on image files, with the config's test pipeline
    and data preprocessor before it and mmdet's rescaling and mask pasting after it.

    Args:
        path (str): the ONNX file.
        config (str, optional): the detector's config (test pipeline, data preprocessor, ``mask_thr_binary``).
            Defaults to None (the one the export wrote into the file).
        providers (list[str], optional): ONNX Runtime execution providers. Defaults to the CPU's.
    """

    SCOPE = 'mmdet'
    TASK = 'detector'

    def inputs(self, image: str) -> tuple[Tensor, dict]:
        """The preprocessed (1, 3, H, W) batch of one image file and its metainfo; the size must be the graph's."""
        inputs, meta = super().inputs(image)
        self.check_size(inputs, image)
        return inputs, meta

    def predict(self, inputs: Tensor, meta: dict) -> dict[str, Tensor]:
        """``bboxes`` (n, 4) in the original image, ``scores``, ``labels`` and ``masks`` (n, h, w) bool of one
        preprocessed image, as ``DetDataSample.pred_instances`` of mmdet's ``predict(..., rescale=True)``."""
        boxes, scores, labels, masks = self.session.run(None, dict(
            image=inputs.numpy(), img_shape=np.asarray(meta['img_shape'], np.float32)))
        boxes = torch.from_numpy(boxes) / torch.tensor(meta['scale_factor']).repeat(2).to(torch.float32)
        return dict(bboxes=boxes, scores=torch.from_numpy(scores), labels=torch.from_numpy(labels),
                    masks=paste_masks(torch.from_numpy(masks), boxes, meta['ori_shape'][:2],
                                       self.cfg.model.test_cfg.rcnn.mask_thr_binary))


def compare_detections(ref: dict[str, Tensor], got: dict[str, Tensor]) -> dict:
    """How deployed detections ``got`` differ from PyTorch's ``ref`` (``bboxes``, ``scores``, ``labels``,
    ``masks``). Each of ``ref``'s detections, by descending score, is paired with the unpaired one of ``got`` of its
    label whose box overlaps it most (IoU above 0.5), so that two detections of near-equal scores may trade places.
    Returns ``count`` (ref's, got's), ``paired``, ``box_rel`` (the largest |difference| / max(|ref's coordinate|,
    1 px) of a pair), ``score_abs`` (the largest score difference of a pair) and ``mask_iou`` (the smallest IoU of a
    pair's masks; 1 without pairs)."""
    from torchvision.ops import box_iou
    overlap = box_iou(ref['bboxes'], got['bboxes']) * (ref['labels'][:, None] == got['labels'][None])
    pairs = []
    for i in ref['scores'].argsort(descending=True, stable=True).tolist():
        j = int(overlap[i].argmax()) if overlap.shape[1] else -1
        if j >= 0 and overlap[i, j] > 0.5:
            pairs.append((i, j))
            overlap[:, j] = 0
    i, j = torch.tensor([p[0] for p in pairs], dtype=torch.long), torch.tensor([p[1] for p in pairs], dtype=torch.long)
    a, b = ref['masks'][i].flatten(1), got['masks'][j].flatten(1)
    union = (a | b).sum(1)
    iou = torch.where(union > 0, (a & b).sum(1) / union.clamp(min=1), 1.0)
    box_rel = (got['bboxes'][j] - ref['bboxes'][i]).abs() / ref['bboxes'][i].abs().clamp(min=1)
    return dict(count=(len(ref['bboxes']), len(got['bboxes'])), paired=len(pairs),
                box_rel=float(box_rel.max()) if pairs else 0.0,
                score_abs=float((got['scores'][j] - ref['scores'][i]).abs().max()) if pairs else 0.0,
                mask_iou=float(iou.min()) if pairs else 1.0)


def pytorch_detections(model: nn.Module, inputs: Tensor, meta: dict) -> dict[str, Tensor]:
    """``pred_instances`` of the detector's ``predict(..., rescale=True)`` on one preprocessed image, as a dict."""
    from mmdet.structures import DetDataSample
    with torch.no_grad():
        pred = model.predict(inputs, [DetDataSample(metainfo=meta)], rescale=True)[0].pred_instances
    return {k: pred[k] for k in ('bboxes', 'scores', 'labels', 'masks')}
