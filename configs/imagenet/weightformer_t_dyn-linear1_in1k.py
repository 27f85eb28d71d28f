# Table 2, dynamic first MLP linear only (Bilateral; static DWConv in the dynamic blocks; paper: 76.4 %).
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_dwc=None))
