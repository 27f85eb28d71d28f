# The frozen softmax DeiT-B teacher of attention-output distillation (mmwf AttentionDistiller): the official
# ImageNet checkpoint, class token and global attention in every block, as the students were transferred from.
distill_teacher = dict(
    type='DeiT', arch='b', with_cls_token=True, out_indices=(11,), final_norm=False,
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/deit_base_patch16_224-b5f2ef4d.pth'))
