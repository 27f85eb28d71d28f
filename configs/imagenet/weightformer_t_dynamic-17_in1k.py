# Table 6, 17 dynamic blocks: all blocks (paper: diverged (70.2 % best before)); the paper does not list the blocks, these are evenly
# spaced and keep the released every-third pattern's phase where they can.
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(dynamic_blocks=dict(every=1, offset=0)))
