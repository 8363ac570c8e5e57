# Baseline - the attention normalisation (Mamba has none): y_i = sum_j Q_i . K_j V_j /
# N.
_base_ = './linear-swin-t.py'

model = dict(backbone=dict(mixer_cfg=dict(normalize=False)))
