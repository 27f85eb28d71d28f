# DeiT-B with ReLU linear attention in every block, Random init (no transfer), Mask R-CNN 1x on COCO.
_base_ = '../_base_/mask_rcnn_plain_vit_coco_1x.py'

model = dict(
    backbone=dict(type='DeiT', arch='b', attn_cfg=dict(type='ReLUAttention'), with_cls_token=True, out_indices=(11,),
                  drop_path_rate=0.1, init_cfg=None),
    neck=dict(in_channels=768))
