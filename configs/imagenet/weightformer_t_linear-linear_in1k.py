# Table 2, dynamic first MLP linear by LinearDynamicLinear (eq. 5, 2x2 pooling); static DWConv.
_base_ = './weightformer_t_dyn-linear1-dwc_in1k.py'

model = dict(backbone=dict(dynamic_dwc=None, dynamic_linear=dict(type='LinearDynamicLinear')))
