# UperNet with a DINO-pretrained DinoVim-S (24 blocks, 512 wide).
_base_ = './upernet_dinovim-base-p16.py'

model = dict(
    backbone=dict(arch='small', init_cfg=dict(
        checkpoint='checkpoints/dinovim-small-p16_dino-in1k.pth')),
    neck=dict(embed_dim=512),
    decode_head=dict(in_channels=[512] * 4),
    auxiliary_head=dict(in_channels=512))
