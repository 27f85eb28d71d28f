# upernet_deit_b_ttt_random_ade20k.py fine-tuned from the ImageNet-1K stage's
# MLPCopy model (cls_deit_b_ttt_mlpcopy_in1k.py).
_base_ = './upernet_deit_b_ttt_random_ade20k.py'

model = dict(backbone=dict(init_cfg=dict(
    checkpoint=_base_.imagenet_stage.format('cls_deit_b_ttt_mlpcopy_in1k'))))
