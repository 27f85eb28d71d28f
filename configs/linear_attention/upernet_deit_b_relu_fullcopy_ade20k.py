# FullCopy init: every tensor softmax DeiT-B shares with this student (embeddings, norms, attention, MLPs).
_base_ = './upernet_deit_b_relu_copy_ade20k.py'

model = dict(backbone=dict(init_cfg=dict(recipe='full_copy')))
