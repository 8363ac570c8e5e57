# Binary-AUC of ViT-B/16's [CLS] attention row (DINO's attention maps) on
# ImageNet-S: softmax(q_cls K^T / sqrt(64)) at the patch keys, last block, per head.
_base_ = './binary-auc_vit-base-p16_imagenet-s.py'

model = dict(method='attention', feature_source=None)
