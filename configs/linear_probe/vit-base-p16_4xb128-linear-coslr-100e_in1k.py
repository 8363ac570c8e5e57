# Linear probe of DINO-pretrained ViT-B/16 (mmpretrain's VisionTransformer):
# [CLS] of the last 8 of 12 blocks. mmpretrain's ViT returns intermediate blocks
# without the final LayerNorm, so the concatenation goes through a
# parameter-free BatchNorm (MAE's probe convention). Paper: 78.2 top-1.
_base_ = './dinovim-base-p16_4xb128-linear-coslr-100e_in1k.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.VisionTransformer',
        arch='base',
        img_size=224,
        patch_size=16,
        out_indices=list(range(-8, 0)),
        out_type='cls_token',
        frozen_stages=12,
        drop_path_rate=0.0,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='work_dirs/dino_vit-base-p16_4xb48-amp-100e_in1k/'
            'epoch_100.pth',
            prefix='teacher.backbone.',
            strict=True)),
    neck=dict(with_bn=True))
