# Binary-AUC of ViT-B/16 (mmpretrain's VisionTransformer) on ImageNet-S: [CLS] vs
# patch tokens, 12 heads of 64 channels.
_base_ = './binary-auc_dinovim-base-p16_imagenet-s.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.VisionTransformer',
        arch='base',
        img_size=224,
        patch_size=16,
        drop_path_rate=0.0))
