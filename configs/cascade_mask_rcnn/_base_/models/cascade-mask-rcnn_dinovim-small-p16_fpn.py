# Cascade Mask R-CNN with a DINO-pretrained DinoVim-S (24 blocks, 512 wide). mmengine
# replaces a list whole, so both neck stages are given, as the base's with 512
# input channels.
_base_ = './cascade-mask-rcnn_dinovim-base-p16_fpn.py'

model = dict(
    backbone=dict(arch='small', init_cfg=dict(
        checkpoint='checkpoints/dinovim-small-p16_dino-in1k.pth')),
    neck=[dict(_base_.model.neck[0], embed_dim=512),
          dict(_base_.model.neck[1], in_channels=[512] * 4)])
