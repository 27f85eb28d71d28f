# The official softmax DeiT-B of the linear-attention transfer study: its checkpoint (the source of every transfer
# recipe) and the frozen teacher of attention-output distillation (mmwf AttentionDistiller), class token and global
# attention in every block, as the students were transferred from.
deit_b_checkpoint = 'checkpoints/deit_base_patch16_224-b5f2ef4d.pth'
distill_teacher = dict(
    type='DeiT', arch='b', with_cls_token=True, out_indices=(11,), final_norm=False,
    init_cfg=dict(type='Pretrained', checkpoint=deit_b_checkpoint))
