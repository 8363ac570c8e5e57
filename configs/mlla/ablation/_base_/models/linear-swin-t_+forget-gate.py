# Baseline + Mamba's forget gate: a per-head scalar decay a_t = exp(-exp(A_log) dt_t)
# per token, so the attention is causal in raster order and recurrent (computed by the
# SSD scan, mmdinomamba.ops.ssd); the same row in Tables 1 and 2.
_base_ = './linear-swin-t.py'

model = dict(backbone=dict(mixer_cfg=dict(forget_gate=True)))
