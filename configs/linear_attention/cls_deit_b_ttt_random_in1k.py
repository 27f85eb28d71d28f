# DeiT-B with TTT (ViT^3) attention in every block, Random init (no transfer), classifying by the mean patch token:
# ImageNet-1K in the recipe of configs/imagenet/_base_/imagenet_swin_300e.py with DeiT's drop path 0.1 (the transfer study's
# own recipe table is not in its text).
_base_ = '../imagenet/_base_/imagenet_swin_300e.py'

model = dict(backbone=dict(type='DeiT', arch='b', attn_cfg=dict(type='TTTAttention'), with_cls_token=False,
                            drop_path_rate=0.1, init_cfg=None))
