# Cascade Mask R-CNN in the ViTDet framework (detectron2 projects/ViTDet, cascade_mask_rcnn_vitdet_b_100ep),
# rebuilt on mmdet 3.x: one 1/16 backbone map -> SimpleFeaturePyramid, 2-conv RPN, three 4conv1fc cascade
# box heads and a 4-conv mask head with LN2d, LSJ 1024 x 1024, AdamW + layer-wise lr decay, 100 epochs.
# A backbone config sets model.backbone, model.neck.in_channels and optim_wrapper.paramwise_cfg.num_layers.
_base_ = ['mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py', 'mmdet::common/lsj-100e_coco-instance.py']
custom_imports = dict(imports=['mmwf'], allow_failed_imports=False)

image_size = (1024, 1024)
norm_cfg = dict(type='LN2d', requires_grad=True)
cascade_stds = ([0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1], [0.033, 0.033, 0.067, 0.067])

model = dict(
    data_preprocessor=dict(batch_augments=[dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)]),
    backbone=dict(_delete_=True),
    neck=dict(_delete_=True, type='SimpleFeaturePyramid', out_channels=256, scale_factors=(4.0, 2.0, 1.0, 0.5),
              num_outs=5),
    rpn_head=dict(num_convs=2),
    roi_head=dict(
        bbox_head=[
            dict(type='Shared4Conv1FCBBoxHead', in_channels=256, conv_out_channels=256, fc_out_channels=1024,
                 roi_feat_size=7, num_classes=80, norm_cfg=norm_cfg, reg_class_agnostic=True,
                 bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0.0] * 4, target_stds=stds),
                 loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
                 loss_bbox=dict(type='SmoothL1Loss', beta=1.0, loss_weight=1.0))
            for stds in cascade_stds],
        mask_head=dict(norm_cfg=norm_cfg)))

data_root = 'data/coco/'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_type='absolute_range', crop_size=image_size, recompute_bbox=True,
         allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='Pad', size=image_size, pad_val=dict(img=(114, 114, 114))),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=4,  # x 16 GPUs = 64
    num_workers=4,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(_delete_=True, type='CocoDataset', data_root=data_root,
                 ann_file='annotations/instances_train2017.json', data_prefix=dict(img='train2017/'),
                 filter_cfg=dict(filter_empty_gt=True, min_size=32), pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator

max_iters = 184375
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
optim_wrapper = dict(
    _delete_=True, type='AmpOptimWrapper', constructor='LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    paramwise_cfg=dict(num_layers=12, decay_rate=0.7))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=250),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=max_iters, milestones=[163889, 177546], gamma=0.1),
]
default_hooks = dict(logger=dict(interval=50), checkpoint=dict(by_epoch=False, interval=5000, max_keep_ckpts=2))
log_processor = dict(by_epoch=False)
auto_scale_lr = dict(enable=False, base_batch_size=64)
