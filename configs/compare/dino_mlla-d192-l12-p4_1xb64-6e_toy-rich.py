# DINO on the rich toy data at 256 tokens: PlainMLLA (MLLA's block and mixer on the
# plain layout), 12 blocks, 192 wide, 6 heads of 32, MLP ratio 4, 4 px patches at
# 64 px (256 patches, no [CLS]: the readout is their mean); 5.88 M parameters.
_base_ = './_base_/dino_toy-rich-64px-p4.py'

model = dict(backbone=dict(_base_.mlla_backbone, _delete_=True,
                           patch_size=_base_.patch_size))
