# Mask R-CNN 1x on COCO for plain ViT backbones, the detection protocol of the linear-attention transfer study
# (after ViT-Adapter's plain-ViT baselines): one 1/16 backbone map -> SimpleFeaturePyramid (x4, x2, x1, x0.5 and
# a max-pooled level) -> mmdet's Mask R-CNN heads; 1333 x 800, 12 epochs, batch 16, AdamW + layer-wise lr decay.
# A backbone config sets model.backbone and model.neck.in_channels.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', 'mmdet::_base_/datasets/coco_instance.py',
          'mmdet::_base_/schedules/schedule_1x.py', 'mmdet::_base_/default_runtime.py']
custom_imports = dict(imports=['mmwf'], allow_failed_imports=False)
runner_type = 'StrictRunner'  # strict checkpoint loading, resume past damaged checkpoints, dataset checks

model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(_delete_=True),
    neck=dict(_delete_=True, type='SimpleFeaturePyramid', out_channels=256, scale_factors=(4.0, 2.0, 1.0, 0.5),
              num_outs=5))

train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16
optim_wrapper = dict(
    _delete_=True, type='AmpOptimWrapper', constructor='LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(num_layers=12, decay_rate=0.7),
    clip_grad=dict(max_norm=1.0, norm_type=2))
custom_hooks = [dict(type='NonFiniteLossHook')]  # stop at the first NaN / inf loss, naming the terms
