# DeiT-B with TTT (ViT^3) attention in every block, fine-tuned with UperNet 160k on ADE20K from the ImageNet-1K stage's
# Random model (cls_deit_b_ttt_random_in1k.py): the ReLU config with another operator.
_base_ = './upernet_deit_b_relu_random_ade20k.py'

model = dict(backbone=dict(attn_cfg=dict(type='TTTAttention'), init_cfg=dict(
    checkpoint=_base_.imagenet_stage.format('cls_deit_b_ttt_random_in1k'))))
