# DINO pretraining of ViT-B/16 (mmpretrain's VisionTransformer, softmax
# attention), the paper's softmax baseline. Paper: linear probe 78.2.
_base_ = [
    '../_base_/models/dino_dinovim-base-p16.py',
    './_base_/dino_4xb48-amp-100e_in1k.py',
]

# DinoVim-B's backbone settings (base, 224 px, patch 16, [CLS] output, drop path
# 0.1) with softmax attention and ViT's initialisation
model = dict(
    backbone=dict(
        type='mmpretrain.VisionTransformer',
        init_cfg=[
            dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.0),
            dict(type='Constant', layer='LayerNorm', val=1.0, bias=0.0),
        ]))
