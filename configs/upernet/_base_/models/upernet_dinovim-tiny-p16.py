# UperNet with a DINO-pretrained DinoVim-T (24 blocks, 256 wide).
_base_ = './upernet_dinovim-base-p16.py'

model = dict(
    backbone=dict(arch='tiny', init_cfg=dict(
        checkpoint='checkpoints/dinovim-tiny-p16_dino-in1k.pth')),
    neck=dict(embed_dim=256),
    decode_head=dict(in_channels=[256] * 4),
    auxiliary_head=dict(in_channels=256))
