# Cascade Mask R-CNN with a DINO-pretrained DinoVim-T (24 blocks, 256 wide). mmengine
# replaces a list whole, so both neck stages are given, as the base's with 256
# input channels.
_base_ = './cascade-mask-rcnn_dinovim-base-p16_fpn.py'

model = dict(
    backbone=dict(arch='tiny', init_cfg=dict(
        checkpoint='checkpoints/dinovim-tiny-p16_dino-in1k.pth')),
    neck=[dict(_base_.model.neck[0], embed_dim=256),
          dict(_base_.model.neck[1], in_channels=[256] * 4)])
