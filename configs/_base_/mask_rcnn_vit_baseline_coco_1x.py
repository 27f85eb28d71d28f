# Mask R-CNN 1x on COCO with ViT-Adapter's plain-ViT baseline (Chen et al., 2023), the detection protocol of the
# linear-attention transfer study: DeiT-B blocks 2, 5, 8, 11 (14 x 14 windows elsewhere, layer scale, no class token)
# -> ViTBaselinePyramid (a LayerNorm and a resampling per level) -> mmdet's FPN and Mask R-CNN heads; 1333 x 800,
# 12 epochs, batch 16, AdamW 1e-4 / 0.05 without layer decay, fp32, no clipping. docs/protocol.md gives each
# setting's reference file and line. A config of the study sets the attention operator and the ImageNet-stage weights.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', 'mmdet::_base_/datasets/coco_instance.py',
          'mmdet::_base_/schedules/schedule_1x.py', 'mmdet::_base_/default_runtime.py', './mmwf_runtime.py']

# the last checkpoint of an ImageNet-1K stage run (configs/linear_attention/cls_*_in1k.py, 300 epochs)
imagenet_stage = 'work_dirs/{}/epoch_300.pth'
model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(_delete_=True, type='DeiT', arch='b', with_cls_token=False, layer_scale=True,
                  out_indices=(2, 5, 8, 11), final_norm=False, window_size=14,
                  window_block_indexes=(0, 1, 3, 4, 6, 7, 9, 10), drop_path_rate=0.1),
    neck=[dict(type='ViTBaselinePyramid', in_channels=768),
          dict(type='FPN', in_channels=[768] * 4, out_channels=256, num_outs=5)])

train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16
optim_wrapper = dict(
    _delete_=True, type='OptimWrapper',
    optimizer=dict(type='AdamW', fused=True, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'pos_embed': dict(decay_mult=0.0), 'norm': dict(decay_mult=0.0),
                                    'bias': dict(decay_mult=0.0)}))
# several GPUs (docs/protocol.md): ViT-Adapter seeds every rank alike (detection/train.py:152-155, mmdet 2.x) and
# leaves TF32 at torch's defaults; global batch 16 (mmdet's schedule_1x auto_scale_lr)
default_hooks = dict(world_size=dict(type='WorldSizeHook', seed_rule='seed'),
                     tf32=dict(type='TF32Hook', matmul=False, cudnn=True),
                     # on CUDA the backbone and the pyramid compiled, mmdet's heads eager (mode=eager: all eager)
                     compile=dict(type='CompileHook', modules=['backbone', 'neck']), **_base_.mmwf_hooks)
randomness = dict(seed=0)
custom_hooks = [dict(type='NonFiniteLossHook')]  # stop at the first NaN / inf loss, naming the terms
