# Baseline + CPE: x <- x + DW3(x) (a depthwise 3x3 conv) before each of the two sub-
# blocks, as in MLLA's block.
_base_ = './linear-swin-t.py'

model = dict(backbone=dict(cpe=True))
