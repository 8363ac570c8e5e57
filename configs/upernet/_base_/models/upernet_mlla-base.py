# UperNet with an ImageNet-1k MLLA-B (96 wide, depths 3-6-21-6, drop path 0.5): the
# official ADE20K model, 51.9 / 52.5 mIoU single / multi-scale in the paper.
_base_ = './upernet_mlla-tiny.py'

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.5,
                  init_cfg=dict(checkpoint='checkpoints/mlla-base_in1k.pth')),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
