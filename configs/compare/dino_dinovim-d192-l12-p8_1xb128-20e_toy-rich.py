# DINO on the rich toy data: DinoVim (bidirectional Mamba-2), 12 blocks, 192 wide
# (d_inner 384 = 6 heads of 64, state 64), 8 px patches at 64 px (64 patches + the
# two [CLS] slots).
_base_ = './_base_/dino_toy-rich-64px.py'

model = dict(backbone=dict(_base_.dinovim_backbone, _delete_=True))
