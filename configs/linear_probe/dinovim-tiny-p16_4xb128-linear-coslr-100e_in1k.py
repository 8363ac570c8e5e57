# Linear probe of DINO-pretrained DinoVim-T: last 8 blocks. Paper: 73.7 top-1.
_base_ = './dinovim-base-p16_4xb128-linear-coslr-100e_in1k.py'

model = dict(
    backbone=dict(
        arch='tiny',
        init_cfg=dict(checkpoint='work_dirs/dino_dinovim-tiny-p16_4xb48-amp-100e_in1k/'
                      'epoch_100.pth')),
    neck=dict(in_channels=256 * 8),
    head=dict(in_channels=256 * 8))
optim_wrapper = dict(optimizer=dict(weight_decay=0.0))
