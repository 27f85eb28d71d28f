# The softmax target: DeiT-B (softmax attention) fine-tuned with UperNet 160k on ADE20K from the official
# ImageNet weights, on ViT-Adapter's plain-ViT baseline.
_base_ = ['../_base_/upernet_vit_baseline_ade20k_160k.py', '../_base_/deit_b_softmax_teacher.py']

model = dict(backbone=dict(init_cfg=dict(type='Pretrained', checkpoint=_base_.deit_b_checkpoint)))
