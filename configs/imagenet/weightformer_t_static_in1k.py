# Table 2, static baseline CNN (no dynamic block; paper: 5.7M, 1.1G, 73.3 %).
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_blocks=[]))
