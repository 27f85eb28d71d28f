# Demo of linear-attention transfer + attention-output distillation with an mmdet detector on the synthetic COCO
# data: a DeiT-T TTT student (no class token), Copy-initialised from a softmax DeiT-T and distilled from it
# (lambda = 50, patch tokens) inside the Cascade Mask R-CNN demo. Data, image size and schedule are that demo's.
# The softmax "checkpoint" is a seeded random DeiT-T written by tools/generate_demo_data.py (no ImageNet weights
# here): the run shows the mechanics (loss_distill falls), not the paper's accuracy.
_base_ = './cascade_wf_t_demo.py'

softmax_checkpoint = 'data/demo/checkpoints/deit_t_softmax.pth'
image_size_fields = dict(fields={'model.student.data_preprocessor.pad_size_divisor': 1})  # the student's, as the demo's model's
# eager: the distiller reads the student's attention outputs through forward hooks during the loss
default_hooks = dict(compile=dict(modules=['student.backbone', 'student.neck'], mode='eager'))
model = dict(
    _delete_=True, type='AttentionDistiller', loss_weight=50.0,
    student=dict(_base_.model,
                 backbone=dict(type='DeiT', arch='t', attn_cfg=dict(type='TTTAttention'), with_cls_token=False,
                               out_indices=(11,),
                               init_cfg=dict(type='SoftmaxTransfer', recipe='copy', checkpoint=softmax_checkpoint))),
    teacher=dict(type='DeiT', arch='t', out_indices=(11,), final_norm=False,
                 init_cfg=dict(type='Pretrained', checkpoint=softmax_checkpoint)))
