# Baseline + LePE: a depthwise 3x3 conv of V added to the attention output.
_base_ = './linear-swin-t.py'

model = dict(backbone=dict(mixer_cfg=dict(lepe=True)))
