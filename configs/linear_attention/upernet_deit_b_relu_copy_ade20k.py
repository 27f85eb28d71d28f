# upernet_deit_b_relu_random_ade20k.py fine-tuned from the ImageNet-1K stage's
# Copy model (cls_deit_b_relu_copy_in1k.py).
_base_ = './upernet_deit_b_relu_random_ade20k.py'

model = dict(backbone=dict(init_cfg=dict(
    checkpoint=_base_.imagenet_stage.format('cls_deit_b_relu_copy_in1k'))))
