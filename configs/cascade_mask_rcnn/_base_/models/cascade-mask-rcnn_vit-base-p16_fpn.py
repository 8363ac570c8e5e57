# Cascade Mask R-CNN with a DINO-pretrained ViT-B/16 (mmpretrain's
# VisionTransformer, softmax attention): LinearViT-B's settings with the other class.
_base_ = './cascade-mask-rcnn_linearvit-base-p16_fpn.py'

model = dict(backbone=dict(
    type='mmpretrain.VisionTransformer', patch_size=16,
    init_cfg=dict(checkpoint='checkpoints/vit-base-p16_dino-in1k.pth')))
