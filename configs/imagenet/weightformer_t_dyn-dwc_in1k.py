# Table 2, dynamic DWConv only (Adaptive, eq. 11; static MLP linears; paper: 74.6 %).
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_mlp='none'))
