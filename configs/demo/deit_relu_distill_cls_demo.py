# Demo of linear-attention transfer + attention-output distillation in classification on the synthetic ImageNet-style
# folder: a DeiT-T ReLU student, Copy-initialised from a softmax DeiT-T and distilled from it (lambda = 50). Data,
# image size and schedule are the WeightFormer-T classification demo's. The softmax "checkpoint" is a seeded random
# DeiT-T written by tools/generate_demo_data.py: the run shows the mechanics (loss_distill falls).
_base_ = './weightformer_t_cls_demo.py'

softmax_checkpoint = 'data/demo/checkpoints/deit_t_softmax.pth'
# eager: the distiller reads the student's attention outputs through forward hooks during the loss
default_hooks = dict(compile=dict(modules=['student.backbone'], mode='eager'))
model = dict(
    _delete_=True, type='AttentionDistiller', loss_weight=50.0,
    student=dict(_base_.model,
                 backbone=dict(type='DeiT', arch='t', attn_cfg=dict(type='ReLUAttention'), num_classes=3,
                               out_type='logits',
                               init_cfg=dict(type='SoftmaxTransfer', recipe='copy', checkpoint=softmax_checkpoint))),
    teacher=dict(type='DeiT', arch='t', out_indices=(11,), final_norm=False,
                 init_cfg=dict(type='Pretrained', checkpoint=softmax_checkpoint)))
