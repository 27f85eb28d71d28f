# Table 1, dynamic DWConv by GAPDynamicDWConv (eq. 10); static MLP linears, as Table 2's DWConv-only row.
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_mlp='none', dynamic_dwc=dict(type='GAPDynamicDWConv')))
