# Baseline + Mamba's block design for the attention sub-block (the paper's "sub", E =
# 1), the MLP kept: MLLA's block without its CPE, RoPE and LePE (V = the attention
# input, no value projection).
_base_ = './linear-swin-t.py'

model = dict(backbone=dict(block_design='sub', mixer_cfg=dict(value_proj=False)))
