# DeiT-B with ReLU linear attention in every block, fine-tuned with Mask R-CNN 1x on COCO from the ImageNet-1K stage's
# Random model (cls_deit_b_relu_random_in1k.py), on ViT-Adapter's plain-ViT baseline.
_base_ = '../_base_/mask_rcnn_vit_baseline_coco_1x.py'

model = dict(backbone=dict(attn_cfg=dict(type='ReLUAttention'), init_cfg=dict(
    type='Pretrained', checkpoint=_base_.imagenet_stage.format('cls_deit_b_relu_random_in1k'))))
