# Table 4, DeiT-T baseline: ViTDet backbone (window attention of 14 in all blocks but 2, 5, 8, 11, no class
# token, no relative position bias, absolute position embedding from 224 resampled to the grid, no final norm).
_base_ = './_base_/cascade_mask_rcnn_vitdet_lsj_coco.py'

model = dict(
    backbone=dict(type='DeiT', arch='t', with_cls_token=False, window_size=14,
                  window_block_indexes=(0, 1, 3, 4, 6, 7, 9, 10), out_indices=(11,), final_norm=False,
                  drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/deit_tiny_patch16_224-a1311bcf.pth')),
    neck=dict(in_channels=192))
