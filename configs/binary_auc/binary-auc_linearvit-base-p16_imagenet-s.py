# Binary-AUC of LinearViT-B on ImageNet-S: [CLS] vs patch tokens, 12 heads of 64
# channels.
_base_ = './binary-auc_dinovim-base-p16_imagenet-s.py'

# DinoVim-B's backbone settings (base, 224 px, patch 16) with linear attention
model = dict(backbone=dict(type='LinearViT'))
