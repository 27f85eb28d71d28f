# Table 3, WeightFormer-S on ImageNet-1K (81.3 % top-1): the release's recipe, drop path 0.2.
_base_ = './_base_/imagenet_swin_300e.py'

model = dict(backbone=dict(type='WeightFormer', arch='s', drop_path_rate=0.2))
