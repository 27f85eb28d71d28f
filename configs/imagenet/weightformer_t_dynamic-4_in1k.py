# Table 6, 4 dynamic blocks: every fourth (1, 5, 9, 13) (paper: 75.4 %); the paper does not list the blocks, these are evenly
# spaced and keep the released every-third pattern's phase where they can.
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_blocks=dict(every=4, offset=1)))
