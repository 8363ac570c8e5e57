# UperNet with an ImageNet-1k MLLA-S (64 wide, depths 3-6-21-6, drop path 0.3).
_base_ = './upernet_mlla-tiny.py'

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.3,
                  init_cfg=dict(checkpoint='checkpoints/mlla-small_in1k.pth')))
