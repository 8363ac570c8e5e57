# DINO pretraining of LinearViT-B (ViT-B with linear attention), the paper's
# linear-attention baseline. Paper: linear probe 74.7.
_base_ = [
    '../_base_/models/dino_dinovim-base-p16.py',
    './_base_/dino_4xb48-amp-100e_in1k.py',
]

# DinoVim-B's backbone settings (base, 224 px, patch 16, [CLS] output, drop path
# 0.1) with linear attention
model = dict(backbone=dict(type='LinearViT'))
