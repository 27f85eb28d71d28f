# Copy init: the attention projections (qkv, proj) of the official softmax DeiT-B in every block.
_base_ = './cls_deit_b_ttt_random_in1k.py'

model = dict(backbone=dict(init_cfg=dict(type='SoftmaxTransfer', recipe='copy',
                                         checkpoint=_base_.deit_b_checkpoint)))
