# Cascade Mask R-CNN in the ViTDet framework (detectron2 projects/ViTDet, cascade_mask_rcnn_vitdet_b_100ep),
# rebuilt on mmdet 3.x setting by setting (docs/protocol.md gives each reference line): one 1/16 backbone map ->
# SimpleFeaturePyramid, 2-conv RPN, three 4conv1fc cascade box heads and one 4-conv mask head with LayerNorm2d
# (ViTDetCascadeRoIHead), L1 box losses, LSJ 1024 x 1024, AdamW + layer-wise lr decay, 100 epochs.
# A backbone config sets model.backbone and model.neck.in_channels.
_base_ = ['mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py', 'mmdet::common/lsj-100e_coco-instance.py',
          './mmwf_runtime.py']

# the Cascade RoI head extends mmdet's: its module registers it
custom_imports = dict(imports=[*_base_.custom_imports.imports, 'mmwf.models.roi_heads'], allow_failed_imports=False)
image_size = (1024, 1024)
norm_cfg = dict(type='LayerNorm2d', eps=1e-6, requires_grad=True)
# box-delta stds: the inverse of detectron2's Box2BoxTransform weights (10, 10, 5, 5), (20, 20, 10, 10), (30, 30, 15, 15)
cascade_stds = ([0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1], [1 / 30, 1 / 30, 1 / 15, 1 / 15])
box_head_init = [  # detectron2: fc c2_xavier_fill (kaiming_uniform, a=1), cls N(0, 0.01), box N(0, 0.001)
    dict(type='Kaiming', a=1, mode='fan_in', nonlinearity='leaky_relu', distribution='uniform',
         override=dict(name='shared_fcs')),
    dict(type='Normal', std=0.01, override=dict(name='fc_cls')),
    dict(type='Normal', std=0.001, override=dict(name='fc_reg'))]

model = dict(
    # every image, at most 1024 a side, is padded after normalisation with 0 to 1024 x 1024 (square_pad=1024)
    data_preprocessor=dict(pad_size_divisor=image_size[0], pad_mask=True),
    backbone=dict(_delete_=True),
    neck=dict(_delete_=True, type='SimpleFeaturePyramid', out_channels=256, scale_factors=(4.0, 2.0, 1.0, 0.5),
              num_outs=5),
    rpn_head=dict(num_convs=2, loss_bbox=dict(_delete_=True, type='L1Loss', loss_weight=1.0)),
    roi_head=dict(
        type='ViTDetCascadeRoIHead',
        stage_loss_weights=[1.0, 1.0, 1.0],
        bbox_head=[
            dict(type='Shared4Conv1FCBBoxHead', in_channels=256, conv_out_channels=256, fc_out_channels=1024,
                 roi_feat_size=7, num_classes=80, norm_cfg=norm_cfg, reg_class_agnostic=True,
                 bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0.0] * 4, target_stds=stds),
                 loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
                 loss_bbox=dict(type='L1Loss', loss_weight=1.0), init_cfg=box_head_init)
            for stds in cascade_stds],
        mask_head=dict(norm_cfg=norm_cfg)),
    train_cfg=dict(
        rpn=dict(assigner=dict(min_pos_iou=0.0), allowed_border=-1),  # low-quality matches at any IoU; all anchors
        rpn_proposal=dict(nms_pre=2000, max_per_img=1000),
        # stage 1 samples 512 RoIs (RPN proposals + ground truth); stages 2-3 take every box stage 1 sampled,
        # regressed by the previous stage, without sampling or ground truth added
        rcnn=[dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=iou, neg_iou_thr=iou, min_pos_iou=iou,
                                 match_low_quality=False, ignore_iof_thr=-1),
                   sampler=dict(type='RandomSampler', num=512, pos_fraction=0.25, neg_pos_ub=-1,
                                add_gt_as_proposals=True) if iou == 0.5 else dict(type='PseudoSampler'),
                   mask_size=28, pos_weight=-1, debug=False)
              for iou in (0.5, 0.6, 0.7)]))

data_root = 'data/coco/'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True, poly2mask=False),  # polygon masks
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), keep_ratio=True, backend='pillow',
         interpolation='bilinear'),  # detectron2 resizes with PIL's bilinear filter
    dict(type='RandomCrop', crop_type='absolute_range', crop_size=image_size, recompute_bbox=True,
         allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-5, 1e-5), keep_empty=False),  # detectron2's threshold; a crop
    # without objects stays
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=4,  # x 16 GPUs = 64
    num_workers=4,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(_delete_=True, type='CocoDataset', data_root=data_root,
                 ann_file='annotations/instances_train2017.json', data_prefix=dict(img='train2017/'),
                 filter_cfg=dict(filter_empty_gt=True), pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator

max_iters = 184375
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
optim_wrapper = dict(
    _delete_=True, type='AmpOptimWrapper', constructor='LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', fused=True, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    # ViTDet's 0.7 for 12 blocks; deeper backbones decay as 12 blocks do (Vim's rule: Vim-T 0.7 ** (12 / 24))
    paramwise_cfg=dict(decay_rate=0.7, reference_depth=12, no_decay='vitdet'))
# detectron2: linear warm-up from 0.001 over 250 iterations (mmengine reaches the end factor at step end - 1)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=251),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=max_iters, milestones=[163889, 177546], gamma=0.1),
]
# several GPUs (docs/protocol.md): detectron2 seeds rank r with seed + r (engine/defaults.py:244) and leaves TF32 at
# torch's defaults; its global batch is 64 (auto_scale_lr below: mmdet's linear rule with --auto-scale-lr)
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(by_epoch=False, interval=5000, max_keep_ckpts=2),
                     world_size=dict(type='WorldSizeHook', seed_rule='seed + rank'),
                     tf32=dict(type='TF32Hook', matmul=False, cudnn=True),
                     # on CUDA the backbone and the pyramid compiled, mmdet's heads eager (mode=eager: all eager)
                     compile=dict(type='CompileHook', modules=['backbone', 'neck']), **_base_.mmwf_hooks)
randomness = dict(seed=0)  # detectron2 draws a random seed when none is given; a fixed one makes reruns repeat
log_processor = dict(by_epoch=False)
custom_hooks = [dict(type='NonFiniteLossHook')]  # stop at the first NaN / inf loss, naming the terms
auto_scale_lr = dict(enable=False, base_batch_size=64)

# What follows image_size (H, W) when a child config or `--cfg-options image_size=S` changes it: the factors of the
# size each field holds (one factor: of H; two: of the sides in the field's order, (w, h) for mmcv's Resize); mmwf's
# tools set them, and the runner named here for another project's tools (mmwf.configs.follow_image_size). The
# 'absolute_range' RandomCrop crops squares only: a non-square size is refused
runner_type = 'ImageSizeRunner'
image_size_fields = dict(written_for=image_size, fields={
    'model.data_preprocessor.pad_size_divisor': 1, 'pipelines[RandomResize].scale': (1, 1),
    'pipelines[RandomCrop].crop_size': (1, 1), 'pipelines[Resize].scale': (1, 1)})
