# Copy init: the attention projections (qkv, proj) of the official softmax DeiT-B in every block.
_base_ = './cls_deit_b_ttt_random_in1k.py'

model = dict(backbone=dict(init_cfg=dict(_delete_=True, type='SoftmaxTransfer', recipe='copy',
                                         checkpoint='checkpoints/deit_base_patch16_224-b5f2ef4d.pth')))
