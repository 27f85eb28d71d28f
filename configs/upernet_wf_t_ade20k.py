# Table 5, WeightFormer-T: UperNet, ADE20K, 512 x 512, 60k iterations; drop path 0.1, as Vim-T/S's UperNet runs.
_base_ = './_base_/upernet_plain_ade20k.py'

model = dict(
    backbone=dict(type='WeightFormer', arch='t', out_indices=(4, 8, 12, 16), final_norm=False, drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/weightformer_t.safetensors')),
    neck=dict(embed_dim=192),
    decode_head=dict(in_channels=[192] * 4, channels=192),
    auxiliary_head=dict(in_channels=192))
