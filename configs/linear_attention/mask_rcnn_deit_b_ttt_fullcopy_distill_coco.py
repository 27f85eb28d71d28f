# mask_rcnn_deit_b_ttt_fullcopy_coco.py plus attention-output distillation from the frozen softmax DeiT-B (lambda = 50).
_base_ = ['./mask_rcnn_deit_b_ttt_fullcopy_coco.py', '../_base_/deit_b_softmax_teacher.py']

model = dict(_delete_=True, type='AttentionDistiller', student=_base_.model, teacher=_base_.distill_teacher,
             loss_weight=50.0)
