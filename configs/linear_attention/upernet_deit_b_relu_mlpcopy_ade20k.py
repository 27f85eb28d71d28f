# MLPCopy init: only the MLPs of the official softmax DeiT-B.
_base_ = './upernet_deit_b_relu_copy_ade20k.py'

model = dict(backbone=dict(init_cfg=dict(recipe='mlp_copy')))
