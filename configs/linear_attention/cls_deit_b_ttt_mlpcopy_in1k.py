# MLPCopy init: the MLPs (fc1, fc2) of the official softmax DeiT-B in every block.
_base_ = './cls_deit_b_ttt_random_in1k.py'

model = dict(backbone=dict(init_cfg=dict(type='SoftmaxTransfer', recipe='mlp_copy',
                                         checkpoint=_base_.deit_b_checkpoint)))
