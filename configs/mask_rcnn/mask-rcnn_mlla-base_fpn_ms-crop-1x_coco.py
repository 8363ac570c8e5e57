# Mask R-CNN on COCO, 1x schedule, 8 GPUs x 2 images, with an ImageNet-1k MLLA-B
# in the official MLLA recipe.
_base_ = [
    './_base_/models/mask-rcnn_mlla-base_fpn.py',
    './_base_/mask-rcnn_adamw_ms-crop-1x_coco.py',
]
