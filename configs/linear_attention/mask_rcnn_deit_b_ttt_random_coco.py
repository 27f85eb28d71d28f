# DeiT-B with TTT (ViT^3) attention, no class token, in every block, Random init (no transfer), Mask R-CNN 1x on
# COCO: the ReLU config with another operator.
_base_ = './mask_rcnn_deit_b_relu_random_coco.py'

model = dict(backbone=dict(attn_cfg=dict(type='TTTAttention'), with_cls_token=False))
