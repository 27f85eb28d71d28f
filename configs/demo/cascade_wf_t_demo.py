# Demo of configs/cascade_wf_t_coco.py on the synthetic shapes data (tools/generate_demo_data.py), trained from
# scratch on a 2-core CPU. Differs only in data (3 classes), image size (128) and schedule (iterations, lr, and
# RPN / RoI sample counts sized for a CPU); backbone, pyramid, cascade heads and mask head are unchanged.
_base_ = '../cascade_wf_t_coco.py'

image_size = (128, 128)
image_size_fields = dict(written_for=image_size)  # the fields below hold it
data_root = 'data/demo/coco/'
metainfo = dict(classes=('circle', 'square', 'triangle'))
num_classes = 3
model = dict(
    data_preprocessor=dict(pad_size_divisor=image_size[0]),
    backbone=dict(init_cfg=None, drop_path_rate=0.0),
    roi_head=dict(
        bbox_head=[dict(head, num_classes=num_classes) for head in _base_.model.roi_head.bbox_head],
        mask_head=dict(num_classes=num_classes)),
    train_cfg=dict(
        rpn=dict(sampler=dict(num=128)),
        rpn_proposal=dict(nms_pre=200, max_per_img=64),
        rcnn=[dict(_base_.model.train_cfg.rcnn[0], sampler=dict(_base_.model.train_cfg.rcnn[0].sampler, num=16)),
              *_base_.model.train_cfg.rcnn[1:]]),
    test_cfg=dict(rpn=dict(nms_pre=300, max_per_img=100)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True, poly2mask=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.8, 1.25), keep_ratio=True),
    dict(type='RandomCrop', crop_type='absolute_range', crop_size=image_size, recompute_bbox=True,
         allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2), keep_empty=False),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/'), filter_cfg=dict(filter_empty_gt=True, min_size=8),
                 pipeline=train_pipeline))
val_dataloader = dict(
    num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file='annotations/instances_val.json',
                 data_prefix=dict(img='val/'), pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

max_iters = 450
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
# from scratch: no layer-wise decay (it is for fine-tuning pretrained weights)
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(lr=1e-4, weight_decay=0.05), clip_grad=dict(max_norm=10.0),
                     paramwise_cfg=dict(decay_rate=1.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=max_iters, milestones=[380], gamma=0.1),
]
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(interval=max_iters),
                     visualization=dict(type='DetVisualizationHook', draw=False))
env_cfg = dict(mp_cfg=dict(mp_start_method='fork', opencv_num_threads=1))
auto_scale_lr = dict(base_batch_size=2)  # the demo's recipe is one process's
