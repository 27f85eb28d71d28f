# DeiT-T (softmax attention, class token) on ImageNet-1K from scratch: the recipe of imagenet_swin_300e.py with
# DeiT's drop path 0.1. The base of every DeiT row: another size sets arch, another operator attn_cfg (the
# class token follows the operator: MHLA and TTT classify by the mean patch token).
_base_ = './_base_/imagenet_swin_300e.py'

model = dict(backbone=dict(type='DeiT', arch='t', drop_path_rate=0.1))
