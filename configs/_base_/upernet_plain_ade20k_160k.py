# UperNet on ADE20K for plain backbones (see upernet_plain_ade20k.py) on the 160k-iteration schedule of the
# linear-attention transfer study, with mixed precision.
_base_ = './upernet_plain_ade20k.py'

max_iters = 160000
train_cfg = dict(max_iters=max_iters, val_interval=16000)
optim_wrapper = dict(type='AmpOptimWrapper')
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1501),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=0, end=max_iters + 1),
]
default_hooks = dict(checkpoint=dict(interval=16000))
