# Table 1, LinearDynamicLinear without pooling before X^T X (eq. 5, w/o pool); static DWConv.
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_dwc=None, dynamic_linear=dict(type='LinearDynamicLinear', pool=False)))
