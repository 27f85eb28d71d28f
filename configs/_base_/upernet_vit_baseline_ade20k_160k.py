# UperNet 160k on ADE20K with ViT-Adapter's plain-ViT baseline levels (Chen et al., 2023), the segmentation protocol
# of the linear-attention transfer study: DeiT-B blocks 2, 5, 8, 11 (global attention, layer scale, no class token)
# -> ViTBaselinePyramid -> UPerHead (512 channels) and an auxiliary FCNHead on the third level; 512 crops, batch 16,
# AdamW 6e-5 / 0.01 with layer decay 0.95, mixed precision, sliding-window test. ViT-Adapter released no plain-ViT
# segmentation config: the settings are its ViT-Adapter-B UperNet config's (docs/protocol.md gives each reference).
# Data, heads and the mmcv poly schedule are those of upernet_plain_ade20k.py.
_base_ = './upernet_plain_ade20k.py'

# the last checkpoint of an ImageNet-1K stage run (configs/linear_attention/cls_*_in1k.py, 300 epochs)
imagenet_stage = 'work_dirs/{}/epoch_300.pth'
model = dict(
    backbone=dict(type='DeiT', arch='b', with_cls_token=False, layer_scale=True, out_indices=(2, 5, 8, 11),
                  final_norm=False, drop_path_rate=0.3),
    neck=dict(_delete_=True, type='ViTBaselinePyramid', in_channels=768),
    decode_head=dict(in_channels=[768] * 4, channels=512),
    auxiliary_head=dict(in_channels=768))

train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16
auto_scale_lr = dict(base_batch_size=16)
max_iters = 160000
train_cfg = dict(max_iters=max_iters, val_interval=16000)
optim_wrapper = dict(
    type='AmpOptimWrapper', loss_scale=dict(init_scale=512),
    optimizer=dict(lr=6e-5, weight_decay=0.01), paramwise_cfg=dict(decay_rate=0.95))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1501),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0, end=max_iters + 1),
]
default_hooks = dict(checkpoint=dict(interval=16000, save_best=None, max_keep_ckpts=3))
