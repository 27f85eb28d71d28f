# FullCopy init: every tensor softmax DeiT-B shares with this student (embeddings, norms, attention, MLPs).
_base_ = './mask_rcnn_deit_b_ttt_copy_coco.py'

model = dict(backbone=dict(init_cfg=dict(recipe='full_copy')))
