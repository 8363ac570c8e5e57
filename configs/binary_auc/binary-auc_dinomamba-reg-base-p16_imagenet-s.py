# Binary-AUC of DinoMamba-Reg-B on ImageNet-S: the readout is the mean of the 12
# register tokens.
_base_ = './binary-auc_dinovim-base-p16_imagenet-s.py'

model = dict(backbone=dict(num_registers=12))
