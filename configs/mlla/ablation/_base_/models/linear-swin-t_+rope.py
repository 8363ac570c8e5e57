# Baseline + RoPE: MLLA's 2-D rotary embedding of Q and K over their full width (row
# positions on the first half of the channel pairs, column positions on the second); the
# normaliser stays un-rotated.
_base_ = './linear-swin-t.py'

model = dict(backbone=dict(mixer_cfg=dict(rope=True)))
