# FullCopy init: every tensor the student shares with the official softmax DeiT-B.
_base_ = './cls_deit_b_ttt_random_in1k.py'

model = dict(backbone=dict(init_cfg=dict(type='SoftmaxTransfer', recipe='full_copy',
                                         checkpoint=_base_.deit_b_checkpoint)))
