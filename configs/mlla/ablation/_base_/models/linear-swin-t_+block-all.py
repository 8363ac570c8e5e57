# Baseline + Mamba's block design for the whole block (the paper's "all", E = 2): LN,
# then x W_in and the gate SiLU(x W_act) at 2C channels, a depthwise 3x3 conv and SiLU,
# the linear attention (2x the heads, V = its input, no value projection), times the
# gate, W_out back to C; no MLP. Q and K are projected from the 2C-wide inside, as in
# MLLA; the paper does not say how wide they are, and this reading counts 32.7M / 5.3G
# against the paper's 28M / 4.7G (see docs/mlla.md).
_base_ = './linear-swin-t.py'

model = dict(
    backbone=dict(block_design='all', expand=2, mixer_cfg=dict(value_proj=False)))
