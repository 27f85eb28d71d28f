# Table 5, DeiT-T baseline: UperNet, ADE20K, 512 x 512, 60k iterations; blocks 3, 5, 7, 11 (BEiT's 12-block UperNet
# and Vim's backbone default); no drop path (Vim's DeiT-T UperNet model dump has none; DeiT-S inherits this).
_base_ = './_base_/upernet_plain_ade20k.py'

model = dict(
    backbone=dict(type='DeiT', arch='t', out_indices=(3, 5, 7, 11), final_norm=False,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/deit_tiny_patch16_224-a1311bcf.pth')),
    neck=dict(embed_dim=192),
    decode_head=dict(in_channels=[192] * 4, channels=192),
    auxiliary_head=dict(in_channels=192))
