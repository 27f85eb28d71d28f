# The softmax target: DeiT-B (softmax attention) fine-tuned with Mask R-CNN 1x on COCO from the official
# ImageNet weights, on ViT-Adapter's plain-ViT baseline.
_base_ = ['../_base_/mask_rcnn_vit_baseline_coco_1x.py', '../_base_/deit_b_softmax_teacher.py']

model = dict(backbone=dict(init_cfg=dict(type='Pretrained', checkpoint=_base_.deit_b_checkpoint)))
