# Mask R-CNN with an ImageNet-1k MLLA-B (96 wide, depths 3-6-21-6), drop path 0.1
# (the official 1x setting).
_base_ = './mask-rcnn_mlla-tiny_fpn.py'

model = dict(
    backbone=dict(arch='base',
                  init_cfg=dict(checkpoint='checkpoints/mlla-base_in1k.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))
