# Table 2, dynamic DWConv by ConvDynamicDWConv (eq. 13); static MLP linears.
_base_ = './weightformer_t_dyn-linear1-dwc_in1k.py'

model = dict(backbone=dict(dynamic_mlp='none', dynamic_dwc=dict(type='ConvDynamicDWConv')))
