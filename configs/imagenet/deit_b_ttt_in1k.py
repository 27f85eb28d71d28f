# DeiT-B with TTTAttention on ImageNet-1K from scratch, classifying by the mean patch token: the recipe of
# imagenet_swin_300e.py with DeiT's drop path 0.1.
_base_ = './_base_/imagenet_swin_300e.py'

model = dict(backbone=dict(
    type='DeiT', arch='b', attn_cfg=dict(type='TTTAttention'), with_cls_token=False, drop_path_rate=0.1))
