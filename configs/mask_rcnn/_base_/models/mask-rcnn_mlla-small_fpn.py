# Mask R-CNN with an ImageNet-1k MLLA-S (64 wide, depths 3-6-21-6), drop path 0.1
# (the official 1x setting).
_base_ = './mask-rcnn_mlla-tiny_fpn.py'

model = dict(
    backbone=dict(arch='small',
                  init_cfg=dict(checkpoint='checkpoints/mlla-small_in1k.pth')))
