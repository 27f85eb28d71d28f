# DeiT-T with ELUAttention on ImageNet-1K from scratch, classifying by the class token: the recipe of
# imagenet_swin_300e.py with DeiT's drop path 0.1.
_base_ = './_base_/imagenet_swin_300e.py'

model = dict(backbone=dict(
    type='DeiT', arch='t', attn_cfg=dict(type='ELUAttention'), with_cls_token=True, drop_path_rate=0.1))
