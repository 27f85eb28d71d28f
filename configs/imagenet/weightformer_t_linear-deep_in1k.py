# Table 2, dynamic first MLP linear by DeepDynamicLinear (eq. 7); static DWConv.
_base_ = './weightformer_t_dyn-linear1-dwc_in1k.py'

model = dict(backbone=dict(dynamic_dwc=None, dynamic_linear=dict(type='DeepDynamicLinear')))
