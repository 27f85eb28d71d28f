# Table 2, dynamic first MLP linear by LinearDynamicLinear without pooling before X^T X (eq. 5); static DWConv.
_base_ = './weightformer_t_dyn-linear1-dwc_in1k.py'

model = dict(backbone=dict(dynamic_dwc=None, dynamic_linear=dict(type='LinearDynamicLinear', pool=False)))
