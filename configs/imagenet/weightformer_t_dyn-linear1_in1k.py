# Table 2, dynamic first MLP linear only (Bilateral, eq. 8; static DWConv in the dynamic blocks).
_base_ = './weightformer_t_dyn-linear1-dwc_in1k.py'

model = dict(backbone=dict(dynamic_dwc=None))
