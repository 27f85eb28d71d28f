# Table 2, both MLP linears dynamic (Bilateral; the second predicted from the MLP's C-wide input; static DWConv).
_base_ = './weightformer_t_dyn-linear1-dwc_in1k.py'

model = dict(backbone=dict(dynamic_dwc=None, dynamic_mlp='both'))
