# Cascade Mask R-CNN on COCO, 3x schedule, multi-scale training, 8 GPUs x 2 images, with a
# DINO-pretrained DinoVim-S (24 bidirectional Mamba-2 blocks, 512 wide).
_base_ = [
    './_base_/models/cascade-mask-rcnn_dinovim-small-p16_fpn.py',
    './_base_/cascade-mask-rcnn_ms-3x_coco.py',
]
