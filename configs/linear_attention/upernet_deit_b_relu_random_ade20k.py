# DeiT-B with ReLU linear attention in every block, Random init (no transfer), UperNet 160k on ADE20K.
_base_ = '../_base_/upernet_plain_ade20k_160k.py'

model = dict(
    backbone=dict(type='DeiT', arch='b', attn_cfg=dict(type='ReLUAttention'), with_cls_token=True,
                  out_indices=(3, 5, 7, 11), final_norm=False, drop_path_rate=0.1, init_cfg=None),
    neck=dict(embed_dim=768),
    decode_head=dict(in_channels=[768] * 4, channels=768),
    auxiliary_head=dict(in_channels=768))
