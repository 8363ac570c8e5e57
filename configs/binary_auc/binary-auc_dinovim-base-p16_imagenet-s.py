# Binary-AUC of DinoVim-B on ImageNet-S (24 heads of 32 channels).
#   python tools/test.py configs/binary_auc/binary-auc_dinovim-base-p16_imagenet-s.py \
#       CHECKPOINT
# CHECKPOINT: a DINO run (its teacher is used), a linear probe or a bare backbone.
_base_ = [
    './_base_/models/activation-map_dinovim-base-p16.py',
    './_base_/datasets/imagenet-s_bs32_224px.py',
]
