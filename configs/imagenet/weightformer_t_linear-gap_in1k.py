# Table 1, dynamic first MLP linear by GAPDynamicLinear (eq. 4); static DWConv, as Table 2's linear-only row.
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_dwc=None, dynamic_linear=dict(type='GAPDynamicLinear')))
