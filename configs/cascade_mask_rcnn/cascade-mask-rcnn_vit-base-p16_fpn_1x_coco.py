# Cascade Mask R-CNN on COCO, 1x schedule, 8 GPUs x 2 images, with a
# DINO-pretrained ViT-B/16 (mmpretrain's VisionTransformer, softmax attention).
_base_ = [
    './_base_/models/cascade-mask-rcnn_vit-base-p16_fpn.py',
    './_base_/cascade-mask-rcnn_1x_coco.py',
]
