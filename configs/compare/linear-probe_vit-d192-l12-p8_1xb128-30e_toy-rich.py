# Linear probe of dino_vit-d192-l12-p8_1xb128-20e_toy-rich.py's teacher: [CLS] of
# the last 4 of 12 blocks. mmpretrain's ViT returns them without the final
# LayerNorm, so they go through the neck's parameter-free BatchNorm, as in
# configs/linear_probe/vit-base-p16_4xb128-linear-coslr-100e_in1k.py.
_base_ = './_base_/linear-probe_toy-rich-64px.py'

model = dict(
    backbone=dict(_base_.vit_backbone, **_base_.probe_backbone,
                  init_cfg=dict(checkpoint='work_dirs/compare/vit/epoch_20.pth')),
    neck=dict(with_bn=True))
