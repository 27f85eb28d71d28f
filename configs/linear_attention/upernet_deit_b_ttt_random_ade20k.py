# DeiT-B with TTT (ViT^3) attention, no class token, in every block, Random init (no transfer), UperNet 160k on
# ADE20K: the ReLU config with another operator.
_base_ = './upernet_deit_b_relu_random_ade20k.py'

model = dict(backbone=dict(attn_cfg=dict(type='TTTAttention'), with_cls_token=False))
