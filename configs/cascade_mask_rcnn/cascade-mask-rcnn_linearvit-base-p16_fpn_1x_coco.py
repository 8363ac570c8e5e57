# Cascade Mask R-CNN on COCO, 1x schedule, 8 GPUs x 2 images, with a
# DINO-pretrained LinearViT-B (ViT-B with linear attention, 12 blocks).
_base_ = [
    './_base_/models/cascade-mask-rcnn_linearvit-base-p16_fpn.py',
    './_base_/cascade-mask-rcnn_1x_coco.py',
]
