# Demo of linear-attention transfer + attention-output distillation on the synthetic ADE20K-layout data: a
# DeiT-T ReLU student, Copy-initialised from a softmax DeiT-T and distilled from it (lambda = 50) inside UperNet.
# Data, image size and schedule are the WF-T UperNet demo's; DeiT-T instead of B so that it runs on a CPU.
# The softmax "checkpoint" is a seeded random DeiT-T written by tools/generate_demo_data.py (the demo has no
# ImageNet weights): the run shows the mechanics (loss_distill falls), not the paper's accuracy.
_base_ = './upernet_wf_t_demo.py'

softmax_checkpoint = 'data/demo/checkpoints/deit_t_softmax.pth'
image_size_fields = dict(fields={'model.student.data_preprocessor.size': (1, 1)})  # the student's, as the demo's model's
# eager: the distiller reads the student's attention outputs through forward hooks during the loss
default_hooks = dict(compile=dict(modules=['student.backbone', 'student.neck'], mode='eager'))
model = dict(
    _delete_=True, type='AttentionDistiller', loss_weight=50.0,
    student=dict(_base_.model,
                 backbone=dict(type='DeiT', arch='t', attn_cfg=dict(type='ReLUAttention'), out_indices=(2, 5, 8, 11),
                               final_norm=False,
                               init_cfg=dict(type='SoftmaxTransfer', recipe='copy', checkpoint=softmax_checkpoint))),
    teacher=dict(type='DeiT', arch='t', out_indices=(11,), final_norm=False,
                 init_cfg=dict(type='Pretrained', checkpoint=softmax_checkpoint)))
