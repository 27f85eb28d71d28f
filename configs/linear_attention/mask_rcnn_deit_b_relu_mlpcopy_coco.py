# MLPCopy init: only the MLPs of the official softmax DeiT-B.
_base_ = './mask_rcnn_deit_b_relu_copy_coco.py'

model = dict(backbone=dict(init_cfg=dict(recipe='mlp_copy')))
