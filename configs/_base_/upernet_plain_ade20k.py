# UperNet on ADE20K for plain backbones, the BEiT / Vim protocol behind Table 5 (Vim seg/configs/vim/upernet,
# mmseg 0.x; docs/protocol.md gives each reference line): 4 maps from 4 evenly spaced blocks -> Feature2Pyramid
# (x4, x2, x1, x0.5), UPerHead with channels = embed dim, auxiliary FCNHead on the third level, 512 x 512 crops,
# sliding-window test (stride 341), AdamW + layer-wise lr decay 0.92 in fp32, 60k iterations, evaluated every 1k
# iterations and reported at the best mIoU.
# A backbone config sets model.backbone, the channels of the neck and heads, and the number of layers.
_base_ = ['mmseg::_base_/models/upernet_r50.py', 'mmseg::_base_/datasets/ade20k.py',
          'mmseg::_base_/default_runtime.py', './mmwf_runtime.py']

image_size = (512, 512)  # the crop; what follows it: image_size_fields below
crop_size = image_size
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(_delete_=True),
    neck=dict(type='Feature2Pyramid', rescales=[4, 2, 1, 0.5], norm_cfg=norm_cfg),
    decode_head=dict(in_index=[0, 1, 2, 3], num_classes=150),
    auxiliary_head=dict(in_index=2, num_classes=150),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(341, 341)))

train_dataloader = dict(batch_size=8)  # x 4 GPUs = 32
max_iters = 60000
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=1000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(
    type='OptimWrapper', constructor='LayerDecayOptimWrapperConstructor',  # fp32: Vim trains with use_fp16=False
    optimizer=dict(type='AdamW', fused=True, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(decay_rate=0.92, reference_depth=12, no_decay='beit'))  # as 12 blocks at any depth
# mmcv 1.x's poly policy with linear warm-up: lr = (1 - t / 60000) * (1e-6 + (1 - 1e-6) * t / 1500 while t < 1500);
# mmengine's schedulers reach their end value at step end - 1, hence 1501 and max_iters + 1
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1501),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0, end=max_iters + 1),
]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=1000, max_keep_ckpts=4, save_best='mIoU',
                    rule='greater'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'),
    # several GPUs (docs/protocol.md): Vim seeds every rank with --seed 0 (seg/train.py:124-129,
    # scripts/ft_vim_tiny_upernet.sh:12) and leaves TF32 at torch's defaults
    world_size=dict(type='WorldSizeHook', seed_rule='seed'),
    tf32=dict(type='TF32Hook', matmul=False, cudnn=True),
    # on CUDA the backbone and Feature2Pyramid compiled, mmseg's heads eager (mode=eager: all eager)
    compile=dict(type='CompileHook', modules=['backbone', 'neck']),
    **_base_.mmwf_hooks)
randomness = dict(seed=0)
auto_scale_lr = dict(enable=False, base_batch_size=32)  # Vim's 4 GPUs x 8; mmseg's linear rule (--auto-scale-lr)
log_processor = dict(by_epoch=False)
custom_hooks = [dict(type='NonFiniteLossHook')]  # stop at the first NaN / inf loss, naming the terms

# What follows image_size (H, W) when a child config or `--cfg-options image_size=S` changes it: the factors of the
# sides each field holds, in its order ((h, w); mmcv's Resize and RandomResize: (w, h)): mmseg's ADE20K pipeline
# resizes to 4 W x H before the crop, the sliding test's stride is 2/3 of the crop; mmwf's tools set them, and the
# runner named here for another project's tools (mmwf.configs.follow_image_size)
runner_type = 'ImageSizeRunner'
image_size_fields = dict(written_for=image_size, fields={
    'crop_size': (1, 1), 'model.data_preprocessor.size': (1, 1), 'model.test_cfg.crop_size': (1, 1),
    'model.test_cfg.stride': (2 / 3, 2 / 3),
    'pipelines[RandomResize].scale': (4, 1), 'pipelines[RandomCrop].crop_size': (1, 1),
    'pipelines[Resize].scale': (4, 1)})
