# DINO pretraining of DinoVim-T (24 blocks, 256 wide). Paper: linear probe 73.7.
_base_ = './dino_dinovim-base-p16_4xb48-amp-100e_in1k.py'

model = dict(backbone=dict(arch='tiny'), head=dict(in_channels=256))
