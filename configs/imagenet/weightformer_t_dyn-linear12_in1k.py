# Table 2, both MLP linears dynamic (Bilateral; static DWConv; paper: 76.7 %).
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_dwc=None, dynamic_mlp='both'))
