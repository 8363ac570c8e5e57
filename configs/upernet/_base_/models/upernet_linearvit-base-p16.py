# UperNet with a DINO-pretrained LinearViT-B (ViT-B with linear attention, 12
# blocks): DinoVim-B's settings (base, 512 px, feature maps, drop path 0.1) with
# the other class and the last block of each quarter of 12.
_base_ = './upernet_dinovim-base-p16.py'

model = dict(backbone=dict(
    type='LinearViT', out_indices=[2, 5, 8, 11],
    init_cfg=dict(checkpoint='checkpoints/linearvit-base-p16_dino-in1k.pth')))
