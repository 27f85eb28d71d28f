# Table 5, WeightFormer-T: UperNet, ADE20K, 512 x 512, 60k iterations; drop path 0.1, as Vim-T/S's UperNet runs.
_base_ = './_base_/upernet_plain_ade20k.py'

model = dict(
    backbone=dict(type='WeightFormer', arch='t', out_indices=(4, 8, 12, 16), final_norm=False, drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/weightformer_t.safetensors')),
    neck=dict(embed_dim=192),
    decode_head=dict(in_channels=[192] * 4, channels=192),
    auxiliary_head=dict(in_channels=192))
# depth-matched layer decay, Vim's rule (its detection, 24 blocks: 0.7 ** (12 / 24)): 17 blocks decay as DeiT-T's 12
optim_wrapper = dict(paramwise_cfg=dict(num_layers=17, decay_rate=0.92 ** (12 / 17)))
