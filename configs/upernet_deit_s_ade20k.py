# Table 5, DeiT-S baseline: UperNet, ADE20K, 512 x 512, 60k iterations.
_base_ = './upernet_deit_t_ade20k.py'

model = dict(
    backbone=dict(arch='s', init_cfg=dict(checkpoint='checkpoints/deit_small_patch16_224-cd65a155.pth')),
    neck=dict(embed_dim=384),
    decode_head=dict(in_channels=[384] * 4, channels=384),
    auxiliary_head=dict(in_channels=384))
