# mask_rcnn_deit_b_ttt_random_coco.py fine-tuned from the ImageNet-1K stage's
# Copy w/ Distill model (cls_deit_b_ttt_copy_distill_in1k.py).
_base_ = './mask_rcnn_deit_b_ttt_random_coco.py'

model = dict(backbone=dict(init_cfg=dict(
    checkpoint=_base_.imagenet_stage.format('cls_deit_b_ttt_copy_distill_in1k'))))
