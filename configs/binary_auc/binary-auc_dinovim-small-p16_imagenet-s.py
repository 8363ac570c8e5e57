# Binary-AUC of DinoVim-S on ImageNet-S (16 heads of 32 channels).
_base_ = './binary-auc_dinovim-base-p16_imagenet-s.py'

model = dict(backbone=dict(arch='small'))
