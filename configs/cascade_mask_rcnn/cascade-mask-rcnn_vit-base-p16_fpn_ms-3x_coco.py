# Cascade Mask R-CNN, 3x schedule, multi-scale training, with a DINO-pretrained
# ViT-B/16 (mmpretrain's VisionTransformer, softmax attention).
_base_ = './_base_/cascade-mask-rcnn_plain-p16_fpn_ms-3x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.VisionTransformer',
        arch='base',
        patch_size=16,
        out_type='featmap',
        out_indices=[2, 5, 8, 11],
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/vit-base-p16_dino-in1k.pth')))
