# DeiT-S with InLineAttention on ImageNet-1K from scratch: deit_s_softmax_in1k.py with another operator.
_base_ = './deit_s_softmax_in1k.py'

model = dict(backbone=dict(attn_cfg=dict(type='InLineAttention')))
