# Class-conditional ImageNet 256 x 256 in latent space with DiT's recipe (facebookresearch/DiT train.py): ADM's
# centre crop and random flip, sd-vae-ft-ema latents x 0.18215 (cached once, with their flips:
# tools/generation/extract_latents.py), AdamW lr 1e-4 without weight decay, global batch 256 (8 GPUs x 32), fp32,
# EMA 0.9999 from the first optimizer step, 400K iterations. Test: 50K samples with the EMA weights, 250 respaced DDPM
# steps, no guidance (Table 7), FID / IS against ADM's reference batch. A model config sets the denoiser.
_base_ = ['../../_base_/mmwf_runtime.py']
default_scope = 'mmengine'
vae_path = 'checkpoints/sd-vae-ft-ema'  # diffusers folder of stabilityai/sd-vae-ft-ema
latent_cache = 'data/imagenet256_latents'  # tools/generation/extract_latents.py data/imagenet/train ...
num_classes = 1000
model = dict(type='LatentDiffusion', denoiser=dict(input_size=32, in_channels=4, num_classes=num_classes),
             vae_path=vae_path, num_timesteps=1000, sampling_steps='250', cfg_scale=1.0)
train_dataloader = dict(
    batch_size=32,  # x 8 GPUs = 256
    num_workers=4,
    persistent_workers=True,
    drop_last=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='LatentCacheDataset', root=latent_cache))
test_dataloader = dict(
    batch_size=32,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='SamplingLabels', num_samples=50000, num_classes=num_classes, seed=0))
test_evaluator = dict(type='GenerationMetric', reference='data/fid_stats/VIRTUAL_imagenet256_labeled.npz',
                      inception='checkpoints/pt_inception-2015-12-05-6726825d.pth')
test_cfg = dict(type='TestLoop')
max_iters = 400_000
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters + 1)
# AdamW by torch's fused kernel (one launch for every parameter; the same update): in every config of a comparison
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(type='AdamW', fused=True, lr=1e-4, weight_decay=0.0))
# mmengine's EMAHook (the same EMA and checkpoint keys) that also runs under FlexibleRunner's DDP / FSDP strategies;
# one update per optimizer step (DiT's update_ema after opt.step()): accumulation keeps the 10K-step horizon
custom_hooks = [dict(type='FlexibleEMAHook', ema_type='ExponentialMovingAverage', momentum=1e-4, update_buffers=True,
                     priority=49),
                dict(type='NonFiniteLossHook')]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=50_000, max_keep_ckpts=3),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    # several GPUs (docs/protocol.md): DiT seeds rank r of W with seed * W + r (train.py:121; the sampler shuffles
    # with the seed itself), keeps the global batch (auto_scale_lr below) and turns TF32 on (train.py:12-13)
    world_size=dict(type='WorldSizeHook', seed_rule='seed * world_size + rank'),
    tf32=dict(type='TF32Hook', matmul=True, cudnn=True),
    compile=dict(type='CompileHook', modules=['denoiser']),  # on CUDA the denoiser compiled (mode=eager: eager)
    **_base_.mmwf_hooks)
env_cfg = dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
               dist_cfg=dict(backend='nccl'))
log_processor = dict(by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0)
auto_scale_lr = dict(enable=False, base_batch_size=256, rule='global_batch')  # DiT train.py:118, 174
