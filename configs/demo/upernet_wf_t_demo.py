# Demo of configs/upernet_wf_t_ade20k.py on the synthetic shapes data in ADE20K layout
# (tools/generate_demo_data.py), trained from scratch on a 2-core CPU. Differs only in data (4 classes),
# image size (128, whole-image test) and schedule; backbone, pyramid and heads are unchanged.
_base_ = '../upernet_wf_t_ade20k.py'

image_size = (128, 128)
crop_size = image_size
# the fields below hold it; the demo resizes to the crop (not to 4 W x H) and tests the whole image
image_size_fields = dict(written_for=image_size, fields={
    'pipelines[RandomResize].scale': (1, 1), 'pipelines[Resize].scale': (1, 1)})
data_root = 'data/demo/ade'
metainfo = dict(classes=('background', 'circle', 'square', 'triangle'),
                palette=[[120, 120, 120], [220, 20, 60], [0, 130, 200], [255, 200, 0]])
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(init_cfg=None, drop_path_rate=0.0),
    decode_head=dict(num_classes=4),
    auxiliary_head=dict(num_classes=4),
    test_cfg=dict(_delete_=True, mode='whole'))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=crop_size, ratio_range=(0.8, 1.25), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=crop_size, keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo, img_suffix='.jpg',
               seg_map_suffix='.png', reduce_zero_label=True)
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(dataset, data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    num_workers=0, persistent_workers=False,
    dataset=dict(dataset, data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader

max_iters = 600
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
# from scratch: no layer-wise decay (it is for fine-tuning pretrained weights)
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(lr=4e-4), paramwise_cfg=dict(decay_rate=1.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0, end=max_iters),
]
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(interval=max_iters))
env_cfg = dict(mp_cfg=dict(mp_start_method='fork', opencv_num_threads=1))
auto_scale_lr = dict(base_batch_size=4)  # the demo's recipe is one process's
