# Binary-AUC of DinoVim-T on ImageNet-S (8 heads of 32 channels).
_base_ = './binary-auc_dinovim-base-p16_imagenet-s.py'

model = dict(backbone=dict(arch='tiny'))
