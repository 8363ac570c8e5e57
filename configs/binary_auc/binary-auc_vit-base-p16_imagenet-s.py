# Binary-AUC of ViT-B/16 (mmpretrain's VisionTransformer) on ImageNet-S: [CLS] vs
# patch tokens, 12 heads of 64 channels.
_base_ = './binary-auc_dinovim-base-p16_imagenet-s.py'

# DinoVim-B's backbone settings (base, 224 px, patch 16) with softmax attention
model = dict(backbone=dict(type='mmpretrain.VisionTransformer'))
