# UperNet with a DINO-pretrained DinoMamba-Reg-B (DinoVim-B with 12 register tokens).
_base_ = './upernet_dinovim-base-p16.py'

model = dict(backbone=dict(num_registers=12, init_cfg=dict(
    checkpoint='checkpoints/dinomamba-reg-base-p16_dino-in1k.pth')))
