# Table 6, 14 dynamic blocks: all but 0, 6, 12 (paper: 76.6 %); the paper does not list the blocks, these are evenly
# spaced and keep the released every-third pattern's phase where they can.
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_blocks=[i for i in range(17) if i % 6]))
