# upernet_wf_t_ade20k.py tested on the whole image (shorter side 512, no sliding window): WeightFormer's cost is
# linear in the tokens, so one pass over the image is cheaper than the overlapping 512 x 512 windows (README,
# "Performance"); training is unchanged.
_base_ = '../upernet_wf_t_ade20k.py'

model = dict(test_cfg=dict(_delete_=True, mode='whole'))
