# Cascade Mask R-CNN on COCO, 1x schedule, 8 GPUs x 2 images, with a
# DINO-pretrained DinoMamba-Reg-B (DinoVim-B with 12 register tokens).
_base_ = [
    './_base_/models/cascade-mask-rcnn_dinomamba-reg-base-p16_fpn.py',
    './_base_/cascade-mask-rcnn_1x_coco.py',
]
