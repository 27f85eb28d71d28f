"""The Cascade R-CNN RoI head as ViTDet trains it (detectron2 ``CascadeROIHeads``), on mmdet 3.x.

Cai & Vasconcelos, "Cascade R-CNN: Delving into High Quality Object Detection" (2018), in the form that
detectron2's ``modeling/roi_heads/cascade_rcnn.py`` implements and Li et al., "Exploring Plain Vision
Transformer Backbones for Object Detection" (ViTDet, 2022) trains. It differs from mmdet's ``CascadeRoIHead``:

1. One mask head (not one per stage), trained on the first stage's sampled proposals and run once, on the
   final detections, at test.
2. The RoI features entering every box head have their gradient scaled by 1 / num_stages.
3. Stages after the first take every box the previous stage predicted (detached, clipped to the image, empty
   boxes dropped; boxes grown from ground-truth proposals included) and match them to the ground truth
   without sampling; the config gives those stages ``PseudoSampler``.
4. At test the stages' class probabilities are averaged (mmdet averages logits).
"""
from __future__ import annotations

import torch
from mmdet.models.roi_heads import CascadeRoIHead
from mmdet.models.task_modules.samplers import PseudoSampler, SamplingResult
from mmdet.models.utils import empty_instances, unpack_gt_instances
from mmdet.registry import MODELS as MMDET_MODELS
from mmdet.structures import SampleList
from mmdet.structures.bbox import bbox2roi, get_box_tensor
from mmengine.structures import InstanceData
from torch import Tensor

from mmwf.registry import MODELS


class ScaleGradient(torch.autograd.Function):
    """Identity in the forward pass; multiplies the gradient by ``scale`` in the backward pass."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


@MODELS.register_module()
class ViTDetCascadeRoIHead(CascadeRoIHead):
    """Cascade box heads and one mask head, trained and run as detectron2's ``CascadeROIHeads``.

    Args:
        num_stages (int): cascade stages. Defaults to 3.
        stage_loss_weights (list[float]): weight of each stage's box losses. Defaults to 1 for every stage
            (detectron2 sums the stage losses).
        bbox_roi_extractor (dict | list[dict]): RoI extractor of the box heads (one, or one per stage).
        bbox_head (dict | list[dict]): box head of each stage; class-agnostic regression, softmax classifier.
        mask_roi_extractor (dict): RoI extractor of the mask head.
        mask_head (dict): the one mask head.
        train_cfg (list[dict]): per stage, ``assigner`` and ``sampler`` (and ``mask_size`` for the first); the
            sampler of every stage after the first must be ``PseudoSampler`` (all boxes are used).
        test_cfg (dict): as mmdet's ``rcnn`` test config.
        init_cfg (dict | list[dict], optional): initialisation config. Defaults to None.

    Losses: ``s{k}.loss_cls``, ``s{k}.loss_bbox`` (and accuracies) per stage, and ``loss_mask``.
    """

    def __init__(self, num_stages: int = 3, stage_loss_weights: list[float] | None = None, **kwargs) -> None:
        stage_loss_weights = [1.0] * num_stages if stage_loss_weights is None else list(stage_loss_weights)
        if len(stage_loss_weights) != num_stages:
            raise ValueError(f'stage_loss_weights {stage_loss_weights} must have one weight per stage '
                             f'(num_stages={num_stages})')
        super().__init__(num_stages=num_stages, stage_loss_weights=stage_loss_weights, **kwargs)
        for stage, head in enumerate(self.bbox_head):
            if not head.reg_class_agnostic or head.custom_activation or getattr(head.loss_cls, 'use_sigmoid', False):
                raise ValueError(f'bbox_head[{stage}] must regress class-agnostic boxes with a softmax classifier '
                                 '(reg_class_agnostic=True, CrossEntropyLoss with use_sigmoid=False), as the ViTDet '
                                 'cascade does')

    def init_mask_head(self, mask_roi_extractor: dict, mask_head: dict) -> None:
        """Build the one mask head and its RoI extractor."""
        if not isinstance(mask_head, dict) or not isinstance(mask_roi_extractor, dict):
            raise ValueError('ViTDetCascadeRoIHead has one mask head: give mask_head and mask_roi_extractor as one '
                             f'dict each, not {type(mask_head).__name__} / {type(mask_roi_extractor).__name__} '
                             "(use mmdet's CascadeRoIHead for a mask head per stage)")
        self.mask_roi_extractor = MMDET_MODELS.build(mask_roi_extractor)
        self.mask_head = MMDET_MODELS.build(mask_head)

    def init_assigner_sampler(self) -> None:
        super().init_assigner_sampler()
        for stage, sampler in enumerate(self.bbox_sampler[1:], 1):
            if not isinstance(sampler, PseudoSampler):
                raise ValueError(f'train_cfg.rcnn[{stage}].sampler is {type(sampler).__name__}; the ViTDet cascade '
                                 'trains every stage after the first on all boxes of the previous stage: set '
                                 "sampler=dict(type='PseudoSampler')")

    def _bbox_forward(self, stage: int, x: tuple[Tensor], rois: Tensor) -> dict:
        """RoI features of ``rois`` (n, 5) -> ``cls_score`` (n, num_classes + 1), ``bbox_pred`` (n, 4)."""
        extractor = self.bbox_roi_extractor[stage]
        feats = extractor(x[:extractor.num_inputs], rois)
        if self.training:
            feats = ScaleGradient.apply(feats, 1.0 / self.num_stages)
        cls_score, bbox_pred = self.bbox_head[stage](feats)
        return dict(cls_score=cls_score, bbox_pred=bbox_pred, bbox_feats=feats)

    def _mask_forward(self, x: tuple[Tensor], rois: Tensor) -> Tensor:
        """Mask logits (n, num_classes, 28, 28) of ``rois`` (n, 5)."""
        return self.mask_head(self.mask_roi_extractor(x[:self.mask_roi_extractor.num_inputs], rois))

    def _sample(self, stage: int, x: tuple[Tensor], boxes: list[Tensor], batch_gt_instances: list,
                batch_gt_instances_ignore: list) -> list[SamplingResult]:
        results = []
        for i, priors in enumerate(boxes):
            pred = InstanceData(priors=priors)
            assigned = self.bbox_assigner[stage].assign(pred, batch_gt_instances[i], batch_gt_instances_ignore[i])
            results.append(self.bbox_sampler[stage].sample(assigned, pred, batch_gt_instances[i],
                                                           feats=[level[i][None] for level in x]))
        return results

    def _next_stage_boxes(self, stage: int, sampling_results: list[SamplingResult], bbox_pred: Tensor,
                          batch_img_metas: list[dict]) -> list[Tensor]:
        """Every box of ``stage`` regressed by its prediction, detached, clipped, without empty boxes."""
        boxes = []
        preds = bbox_pred.detach().split([len(res.priors) for res in sampling_results])
        for res, pred, meta in zip(sampling_results, preds, batch_img_metas):
            regressed = get_box_tensor(self.bbox_head[stage].regress_by_class(get_box_tensor(res.priors), None,
                                                                              pred, meta))
            boxes.append(regressed[((regressed[:, 2:] - regressed[:, :2]) > 0).all(1)])
        return boxes

    def loss(self, x: tuple[Tensor], rpn_results_list: list[InstanceData], batch_data_samples: SampleList) -> dict:
        """Box losses of every stage and the mask loss, from the features ``x`` and the RPN proposals."""
        batch_gt_instances, batch_gt_instances_ignore, batch_img_metas = unpack_gt_instances(batch_data_samples)
        boxes = [res.bboxes for res in rpn_results_list]
        losses = {}
        for stage in range(self.num_stages):
            sampling_results = self._sample(stage, x, boxes, batch_gt_instances, batch_gt_instances_ignore)
            bbox_results = self.bbox_loss(stage, x, sampling_results)
            for name, value in bbox_results['loss_bbox'].items():
                losses[f's{stage}.{name}'] = value * self.stage_loss_weights[stage] if 'loss' in name else value
            if stage == 0 and self.with_mask:
                pos_rois = bbox2roi([res.pos_priors for res in sampling_results])
                losses.update(self.mask_head.loss_and_target(
                    mask_preds=self._mask_forward(x, pos_rois), sampling_results=sampling_results,
                    batch_gt_instances=batch_gt_instances, rcnn_train_cfg=self.train_cfg[0])['loss_mask'])
            if stage < self.num_stages - 1:
                boxes = self._next_stage_boxes(stage, sampling_results, bbox_results['bbox_pred'], batch_img_metas)
        return losses

    def _refine_roi(self, x: tuple[Tensor], rois: Tensor, batch_img_metas: list[dict],
                    num_proposals_per_img: tuple[int, ...], **kwargs) -> tuple:
        """Run the stages on ``rois`` (n, 5) at test time -> per image: the last stage's input RoIs, the log of
        the class probabilities averaged over the stages, and the last stage's box deltas."""
        rois_per_img = rois.split(num_proposals_per_img)
        probs = 0
        for stage in range(self.num_stages):
            results = self._bbox_forward(stage, x, torch.cat(rois_per_img))
            probs = probs + results['cls_score'].softmax(-1) / self.num_stages
            bbox_preds = results['bbox_pred'].split(num_proposals_per_img)
            if stage < self.num_stages - 1:
                rois_per_img = [torch.cat([r[:, :1], get_box_tensor(
                    self.bbox_head[stage].regress_by_class(r[:, 1:], None, pred, meta))], 1)
                    for r, pred, meta in zip(rois_per_img, bbox_preds, batch_img_metas)]
        # the last box head's predict_by_feat applies a softmax: on log-probabilities it returns them unchanged
        return rois_per_img, [p.log() for p in probs.split(num_proposals_per_img)], bbox_preds

    def predict_mask(self, x: tuple[Tensor], batch_img_metas: list[dict], results_list: list[InstanceData],
                     rescale: bool = False) -> list[InstanceData]:
        """Run the mask head once on the final detections."""
        mask_rois = bbox2roi([res.bboxes for res in results_list])
        if mask_rois.shape[0] == 0:
            return empty_instances(batch_img_metas, mask_rois.device, task_type='mask', instance_results=results_list,
                                   mask_thr_binary=self.test_cfg.mask_thr_binary)
        mask_preds = self._mask_forward(x, mask_rois).split([len(res) for res in results_list])
        return self.mask_head.predict_by_feat(mask_preds=mask_preds, results_list=results_list,
                                              batch_img_metas=batch_img_metas, rcnn_test_cfg=self.test_cfg,
                                              rescale=rescale)

    def forward(self, x: tuple[Tensor], rpn_results_list: list[InstanceData],
                batch_data_samples: SampleList) -> tuple:
        """Tensor outputs (mmdet's ``mode='tensor'``): per-image class scores, box deltas and mask logits."""
        batch_img_metas = [sample.metainfo for sample in batch_data_samples]
        proposals = [res.bboxes for res in rpn_results_list]
        num = tuple(len(p) for p in proposals)
        rois, cls_scores, bbox_preds = self._refine_roi(x, bbox2roi(proposals), batch_img_metas, num)
        if not self.with_mask:
            return cls_scores, bbox_preds
        return cls_scores, bbox_preds, self._mask_forward(x, torch.cat(rois)).split(num)
