# Baseline + Mamba's shortcut D (.) x: a learnable D per channel times the values, added
# to the attention output.
_base_ = './linear-swin-t.py'

model = dict(backbone=dict(mixer_cfg=dict(shortcut=True)))
