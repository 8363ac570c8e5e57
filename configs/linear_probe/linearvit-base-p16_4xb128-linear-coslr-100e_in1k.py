# Linear probe of DINO-pretrained LinearViT-B: [CLS] of the last 8 of 12 blocks,
# each through the final LayerNorm (as DINO's ViT probe). Paper: 74.7 top-1.
_base_ = './dinovim-base-p16_4xb128-linear-coslr-100e_in1k.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='LinearViT',
        arch='base',
        img_size=224,
        patch_size=16,
        out_indices=list(range(-8, 0)),
        out_type='cls_token',
        feature_source='normed',
        frozen_stages=12,
        drop_path_rate=0.0,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='work_dirs/dino_linearvit-base-p16_4xb48-amp-100e_in1k/'
            'epoch_100.pth',
            prefix='teacher.backbone.')))
