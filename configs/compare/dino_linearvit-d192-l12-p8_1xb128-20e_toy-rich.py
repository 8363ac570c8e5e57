# DINO on the rich toy data: LinearViT (linear attention), 12 blocks, 192 wide,
# 3 heads, MLP ratio 4, 8 px patches at 64 px (64 patches + [CLS]).
_base_ = './_base_/dino_toy-rich-64px.py'

model = dict(backbone=dict(_base_.linearvit_backbone, _delete_=True))
