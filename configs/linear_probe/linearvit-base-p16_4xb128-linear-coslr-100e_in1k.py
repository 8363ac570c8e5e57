# Linear probe of DINO-pretrained LinearViT-B: [CLS] of the last 8 of 12 blocks,
# each through the final LayerNorm (as DINO's ViT probe). Paper: 74.7 top-1.
_base_ = './dinovim-base-p16_4xb128-linear-coslr-100e_in1k.py'

# DinoVim-B's probe settings (base, 224 px, patch 16, last 8 blocks' [CLS], the
# teacher of a DINO run) with linear attention, all 12 blocks frozen
model = dict(
    backbone=dict(
        type='LinearViT',
        feature_source='normed',
        frozen_stages=12,
        init_cfg=dict(checkpoint='work_dirs/dino_linearvit-base-p16_4xb48-amp-100e_in1k/'
                      'epoch_100.pth')))
