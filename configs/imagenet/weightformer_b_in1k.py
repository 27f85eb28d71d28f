# Table 3, WeightFormer-B on ImageNet-1K (83.4 % top-1): WeightFormer-S trained from scratch at 448 x 448 with the
# same recipe, drop path 0.2, in fp32 (the release's cfg/wfm_b.yaml does not enable AMP); test resize 512, crop 448.
_base_ = './_base_/imagenet_swin_300e.py'

image_size = 448
image_size_fields = dict(written_for=image_size)  # the pipelines below hold it
model = dict(backbone=dict(type='WeightFormer', arch='b', drop_path_rate=0.2))
train_pipeline = [dict(t, scale=image_size) if t['type'] == 'RandomResizedCrop' else t for t in _base_.train_pipeline]
test_pipeline = [dict(t, scale=(image_size * 256 // 224,) * 2) if t['type'] == 'Resize' else
                 dict(t, crop_size=image_size) if t['type'] == 'CenterCrop' else t for t in _base_.test_pipeline]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
optim_wrapper = dict(type='OptimWrapper')
