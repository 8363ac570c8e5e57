# DINO pretraining of DinoMamba-Reg-B: DinoVim-B with 12 interleaved register
# tokens instead of the middle [CLS]; the readout is the mean of the registers.
# Paper: linear probe 78.5.
_base_ = './dino_dinovim-base-p16_4xb48-amp-100e_in1k.py'

model = dict(backbone=dict(num_registers=12))
