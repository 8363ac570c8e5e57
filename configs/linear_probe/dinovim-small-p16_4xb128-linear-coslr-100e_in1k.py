# Linear probe of DINO-pretrained DinoVim-S: last 4 blocks. Paper: 77.4 top-1.
_base_ = './dinovim-base-p16_4xb128-linear-coslr-100e_in1k.py'

num_blocks = 4
model = dict(
    backbone=dict(
        arch='small',
        out_indices=list(range(-num_blocks, 0)),
        init_cfg=dict(checkpoint='work_dirs/dino_dinovim-small-p16_4xb48-amp-100e_in1k/'
                      'epoch_100.pth')),
    neck=dict(in_channels=512 * num_blocks),
    head=dict(in_channels=512 * num_blocks))
optim_wrapper = dict(optimizer=dict(weight_decay=0.001))
