# Demo of configs/imagenet/weightformer_t_in1k.py on the synthetic ImageNet-style folder (data/demo/cls: circle,
# square, triangle; tools/generate_demo_data.py), trained from scratch on a 2-core CPU. Differs only in data (3
# classes, 128 x 128), batch and schedule (iteration-based); model, augmentation and optimiser are the real ones.
_base_ = '../imagenet/weightformer_t_in1k.py'

image_size = 128
image_size_fields = dict(written_for=image_size)  # the pipelines below hold it
num_classes = 3
data_root = 'data/demo/cls'
data_preprocessor = dict(num_classes=num_classes)
model = dict(backbone=dict(num_classes=num_classes))
train_pipeline = [dict(t, scale=image_size) if t['type'] == 'RandomResizedCrop' else t for t in _base_.train_pipeline]
test_pipeline = [dict(t, scale=(image_size * 256 // 224,) * 2) if t['type'] == 'Resize' else
                 dict(t, crop_size=image_size) if t['type'] == 'CenterCrop' else t for t in _base_.test_pipeline]
train_dataloader = dict(
    batch_size=32, num_workers=0, persistent_workers=False, drop_last=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(_delete_=True, type='CustomDataset', data_root=data_root, data_prefix='train',
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=32, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='CustomDataset', data_root=data_root, data_prefix='val', pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(topk=(1,))
test_evaluator = val_evaluator

max_iters = 300
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(lr=1e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=0, end=max_iters),
]
default_hooks = dict(logger=dict(interval=20), checkpoint=dict(by_epoch=False, interval=max_iters))
log_processor = dict(by_epoch=False)
env_cfg = dict(mp_cfg=dict(mp_start_method='fork', opencv_num_threads=1))
auto_scale_lr = dict(base_batch_size=32)  # the demo's recipe is one process's
