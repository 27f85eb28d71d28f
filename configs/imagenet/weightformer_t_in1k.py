# Table 3, WeightFormer-T on ImageNet-1K (76.3 % top-1): the release's recipe, no drop path.
_base_ = './_base_/imagenet_swin_300e.py'

model = dict(backbone=dict(type='WeightFormer', arch='t', drop_path_rate=0.0))
