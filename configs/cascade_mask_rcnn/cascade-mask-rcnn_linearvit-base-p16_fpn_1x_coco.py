# Cascade Mask R-CNN, 1x schedule, with a DINO-pretrained
# LinearViT-B (ViT-B with linear attention, 12 blocks).
_base_ = './_base_/cascade-mask-rcnn_plain-p16_fpn_1x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='LinearViT',
        arch='base',
        out_type='featmap',
        out_indices=[2, 5, 8, 11],
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/linearvit-base-p16_dino-in1k.pth')))
