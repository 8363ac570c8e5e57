# Binary-AUC of LinearViT-B on ImageNet-S: [CLS] vs patch tokens, 12 heads of 64
# channels.
_base_ = './binary-auc_dinovim-base-p16_imagenet-s.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='LinearViT',
        arch='base',
        img_size=224,
        patch_size=16,
        drop_path_rate=0.0))
