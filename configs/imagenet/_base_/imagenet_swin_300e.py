# ImageNet-1K classification in mmpretrain with the WeightFormer release's recipe (LeapLabTHU/WeightFormer: config.py
# and cfg/wfm_*.yaml, the Swin protocol): 300 epochs at batch 2048 (8 GPUs x 256), AdamW lr 5e-4 x 2048 / 512 =
# 2e-3, weight decay 0.05 (not on biases and 1-D tensors), cosine to 2e-5 per iteration after a 20-epoch linear
# warm-up from 2e-6, gradient clipping at 5, label smoothing 0.1, Mixup 0.8 / CutMix 1.0 (one per batch),
# RandAugment m9-mstd0.5 (increasing), random erasing 0.25 per pixel, bicubic; test: square resize to 256, crop 224.
# A model config sets the backbone (with num_classes=1000, out_type='logits'); the head is parameter-free.
_base_ = ['mmpretrain::_base_/default_runtime.py', '../../_base_/mmwf_runtime.py']

num_classes = 1000
image_size = 224
data_preprocessor = dict(num_classes=num_classes, mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                         to_rgb=True)
bgr_mean = data_preprocessor['mean'][::-1]
bgr_std = data_preprocessor['std'][::-1]
model = dict(
    type='ImageClassifier',
    backbone=dict(num_classes=num_classes, out_type='logits'),  # the family's head: norm, pooling, Linear
    head=dict(type='ClsHead', loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original')),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=image_size, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandAugment', policies='timm_increasing', num_policies=2, total_level=10, magnitude_level=9,
         magnitude_std=0.5, hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic')),
    dict(type='RandomErasing', erase_prob=0.25, mode='rand', min_area_ratio=0.02, max_area_ratio=1 / 3,
         fill_color=bgr_mean, fill_std=bgr_std),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size * 256 // 224,) * 2, backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=image_size),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=256,  # x 8 GPUs = 2048
    num_workers=8,
    drop_last=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='ImageNet', data_root='data/imagenet', split='train', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=64,
    num_workers=8,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='ImageNet', data_root='data/imagenet', split='val', pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

max_epochs = 300
warmup_epochs = 20
optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(type='AdamW', fused=True, lr=5e-4 * 2048 / 512, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, flat_decay_mult=0.0),
    clip_grad=dict(max_norm=5.0))
# timm's CosineLRScheduler as the release runs it: cosine over all 300 epochs, the first 20 replaced by a linear
# warm-up; mmengine multiplies the two, which is up to 1.1 % below the release's lr (at the end of the warm-up)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=warmup_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=2e-5, by_epoch=True, begin=0, end=max_epochs, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(base_batch_size=2048, enable=False)
# several GPUs (docs/protocol.md): the release seeds rank r with SEED + r (main.py:120), sets no TF32, and scales
# lr, warm-up lr and minimum lr linearly with the global batch (main.py:126-134: auto_scale_lr, --auto-scale-lr)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3, save_best='auto'),
                     world_size=dict(type='WorldSizeHook', seed_rule='seed + rank'),
                     tf32=dict(type='TF32Hook', matmul=False, cudnn=True),
                     # on CUDA the backbone compiled (mode=eager: eager)
                     compile=dict(type='CompileHook', modules=['backbone']), **_base_.mmwf_hooks)
custom_hooks = [dict(type='NonFiniteLossHook')]
randomness = dict(seed=0)

# What follows image_size (one int, or (H, W)) when a child config or `--cfg-options image_size=S` changes it: the
# training crop, the test resize (256 / 224 of it) and crop, both sides of each (RandomResizedCrop lists (h, w),
# mmcv's Resize and CenterCrop (w, h)); mmwf's tools set them, and the runner named here for mmpretrain's tools
# (mmwf.configs.follow_image_size)
runner_type = 'ImageSizeRunner'
image_size_fields = dict(written_for=image_size, fields={
    'pipelines[RandomResizedCrop].scale': (1, 1), 'pipelines[Resize].scale': (256 / 224, 256 / 224),
    'pipelines[CenterCrop].crop_size': (1, 1)})
