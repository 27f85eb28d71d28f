# Table 5, WeightFormer-S: UperNet, ADE20K, 512 x 512, 60k iterations.
_base_ = './upernet_wf_t_ade20k.py'

model = dict(
    backbone=dict(arch='s', init_cfg=dict(checkpoint='checkpoints/weightformer_s.safetensors')),
    neck=dict(embed_dim=384),
    decode_head=dict(in_channels=[384] * 4, channels=384),
    auxiliary_head=dict(in_channels=384))
