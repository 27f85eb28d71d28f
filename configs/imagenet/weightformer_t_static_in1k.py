# Table 2, static baseline CNN (no dynamic block) on the 18-block trunk.
_base_ = './weightformer_t_dyn-linear1-dwc_in1k.py'

model = dict(backbone=dict(dynamic_blocks=[]))
