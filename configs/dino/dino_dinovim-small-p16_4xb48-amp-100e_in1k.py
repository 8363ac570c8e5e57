# DINO pretraining of DinoVim-S (24 blocks, 512 wide). Paper: linear probe 77.4.
_base_ = './dino_dinovim-base-p16_4xb48-amp-100e_in1k.py'

model = dict(backbone=dict(arch='small'), head=dict(in_channels=512))
