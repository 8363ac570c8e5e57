# DINO on the rich toy data: PlainMLLA (MLLA's block and mixer on the plain layout of
# the other three: linear attention with RoPE, LePE, CPE and the SiLU gate), 12
# blocks, 192 wide, 6 heads of 32, MLP ratio 4, 8 px patches at 64 px (64 patches,
# no [CLS]: the readout is their mean).
_base_ = './_base_/dino_toy-rich-64px.py'

model = dict(backbone=dict(_base_.mlla_backbone, _delete_=True))
