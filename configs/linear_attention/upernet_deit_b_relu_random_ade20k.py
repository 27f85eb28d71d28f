# DeiT-B with ReLU linear attention in every block, fine-tuned with UperNet 160k on ADE20K from the ImageNet-1K stage's
# Random model (cls_deit_b_relu_random_in1k.py), on ViT-Adapter's plain-ViT baseline.
_base_ = '../_base_/upernet_vit_baseline_ade20k_160k.py'

model = dict(backbone=dict(attn_cfg=dict(type='ReLUAttention'), init_cfg=dict(
    type='Pretrained', checkpoint=_base_.imagenet_stage.format('cls_deit_b_relu_random_in1k'))))
