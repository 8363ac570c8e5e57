# Cascade Mask R-CNN on COCO, 3x schedule, multi-scale training, 8 GPUs x 2 images, with a
# DINO-pretrained ViT-B/16 (mmpretrain's VisionTransformer, softmax attention).
_base_ = [
    './_base_/models/cascade-mask-rcnn_vit-base-p16_fpn.py',
    './_base_/cascade-mask-rcnn_ms-3x_coco.py',
]
