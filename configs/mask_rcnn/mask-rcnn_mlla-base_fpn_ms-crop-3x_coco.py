# Mask R-CNN on COCO, 3x schedule, 8 GPUs x 2 images, with an ImageNet-1k MLLA-B
# (drop path 0.3) in the official MLLA recipe.
_base_ = [
    './_base_/models/mask-rcnn_mlla-base_fpn_drop-path-0.3.py',
    './_base_/mask-rcnn_adamw_ms-crop-3x_coco.py',
]
