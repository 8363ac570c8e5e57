# Baseline + Mamba's input gate: V <- Delta (.) V, Delta = softplus(x W_1 W_2 + b) per
# token and channel (W_1 of rank ceil(C / 16), as Mamba's step), in the non-causal
# attention as the authors describe it (LeapLabTHU/MLLA issue #21).
_base_ = './linear-swin-t.py'

model = dict(backbone=dict(mixer_cfg=dict(input_gate=True)))
