# DINO on the rich toy data at 256 tokens: LinearViT (linear attention), 12 blocks,
# 192 wide, 3 heads of 64, MLP ratio 4, 4 px patches at 64 px (256 patches +
# [CLS]); 5.40 M parameters.
_base_ = './_base_/dino_toy-rich-64px-p4.py'

model = dict(backbone=dict(_base_.linearvit_backbone, _delete_=True,
                           patch_size=_base_.patch_size))
