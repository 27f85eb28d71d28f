# DeiT-S (softmax attention) on ImageNet-1K from scratch: deit_t_softmax_in1k.py at another size.
_base_ = './deit_t_softmax_in1k.py'

model = dict(backbone=dict(arch='s'))
