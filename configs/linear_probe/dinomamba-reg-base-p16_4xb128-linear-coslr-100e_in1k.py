# Linear probe of DINO-pretrained DinoMamba-Reg-B: last 8 blocks, each read out
# as the mean of its 12 registers. Paper: 78.5 top-1.
_base_ = './dinovim-base-p16_4xb128-linear-coslr-100e_in1k.py'

model = dict(
    backbone=dict(
        num_registers=12,
        init_cfg=dict(checkpoint='work_dirs/dino_dinomamba-reg-base-p16_4xb48-amp-'
                      '100e_in1k/epoch_100.pth')))
