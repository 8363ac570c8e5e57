# Cascade Mask R-CNN on COCO, 1x schedule, 8 GPUs x 2 images, with a
# DINO-pretrained DinoVim-B (24 bidirectional Mamba-2 blocks, 768 wide).
_base_ = [
    './_base_/models/cascade-mask-rcnn_dinovim-base-p16_fpn.py',
    './_base_/cascade-mask-rcnn_1x_coco.py',
]
