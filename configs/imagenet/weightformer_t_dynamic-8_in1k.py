# Table 6, 8 dynamic blocks: every second (1, 3, ..., 15) (paper: 76.2 %); the paper does not list the blocks, these are evenly
# spaced and keep the released every-third pattern's phase where they can.
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_blocks=dict(every=2, offset=1)))
