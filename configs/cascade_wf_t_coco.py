# Table 4, WeightFormer-T: Cascade Mask R-CNN, ViTDet LSJ 1024, 100 epochs.
_base_ = './_base_/cascade_mask_rcnn_vitdet_lsj_coco.py'

model = dict(
    backbone=dict(type='WeightFormer', arch='t', out_indices=(16,), final_norm=False, drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/weightformer_t.safetensors')),
    neck=dict(in_channels=192))
