# cls_deit_b_relu_mlpcopy_in1k.py plus attention-output distillation from the frozen softmax DeiT-B (lambda = 50).
_base_ = './cls_deit_b_relu_mlpcopy_in1k.py'

model = dict(_delete_=True, type='AttentionDistiller', student=_base_.model, teacher=_base_.distill_teacher,
             loss_weight=50.0)
# eager: the distiller reads the student's attention outputs through forward hooks during the loss
default_hooks = dict(compile=dict(modules=['student.backbone'], mode='eager'))
