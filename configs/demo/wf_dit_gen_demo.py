# Demo of configs/generation/wf_dit_s_2_in256.py on the generation demo's shapes (mmwf.datasets.generate, its gen/
# folders: one upright, centred shape of a random colour on a plain background), trained from scratch on a 2-core
# CPU. Differs in data (3 classes, 16 x 16 images), space (pixels: no VAE), size (the WF-DiT block at width 128 and
# depth 5, dynamic blocks 1 and 4; 2 x 2 patches), schedule, learning rate, EMA decay (0.995: a horizon of 200
# optimizer steps, a tenth of the run) and sampling (50 respaced steps, guidance 4).
_base_ = '../generation/wf_dit_s_2_in256.py'

num_classes = 3
model = dict(denoiser=dict(arch=dict(_delete_=True, hidden_size=128, depth=5), input_size=16,
                           in_channels=3, num_classes=num_classes),
             vae_path=None, sampling_steps='50', cfg_scale=4.0)
train_dataloader = dict(
    batch_size=32, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, type='ClassFolderImages', root='data/demo/gen/train', size=16))
test_dataloader = None  # tools/demo.py --tasks gen samples and measures with the demo's classifier
test_cfg = None
test_evaluator = None
max_iters = 2200
train_cfg = dict(max_iters=max_iters, val_interval=max_iters + 1)
optim_wrapper = dict(optimizer=dict(lr=3e-3))
custom_hooks = [dict(type='FlexibleEMAHook', ema_type='ExponentialMovingAverage', momentum=5e-3, update_buffers=True,
                     priority=49),
                dict(type='NonFiniteLossHook')]
default_hooks = dict(logger=dict(interval=50), checkpoint=dict(interval=max_iters))
env_cfg = dict(dist_cfg=dict(backend='gloo'))
auto_scale_lr = dict(base_batch_size=32)  # the demo's recipe is one process's
