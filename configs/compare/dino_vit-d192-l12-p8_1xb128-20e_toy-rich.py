# DINO on the rich toy data: mmpretrain's VisionTransformer (softmax attention),
# 12 blocks, 192 wide, 3 heads, 8 px patches at 64 px (64 patches + [CLS]).
_base_ = './_base_/dino_toy-rich-64px.py'

model = dict(backbone=dict(_base_.vit_backbone, _delete_=True))
