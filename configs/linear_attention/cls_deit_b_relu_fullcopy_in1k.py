# FullCopy init: every tensor the student shares with the official softmax DeiT-B.
_base_ = './cls_deit_b_relu_random_in1k.py'

model = dict(backbone=dict(init_cfg=dict(_delete_=True, type='SoftmaxTransfer', recipe='full_copy',
                                         checkpoint='checkpoints/deit_base_patch16_224-b5f2ef4d.pth')))
