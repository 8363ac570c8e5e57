# Baseline + Mamba's block design for the whole block (the paper's "all", E = 2): LN,
# then x W_in and the gate SiLU(x W_act) at 2C channels, a depthwise 3x3 conv and SiLU,
# the linear attention (2x the heads, V = its input, no value projection), times the
# gate, W_out back to C; no MLP. Q and K are projected from the 2C-wide inside, as in
# MLLA. The paper keeps #params at 28M without saying how: at Swin-T's depths 2-2-6-2
# this block counts 32.7M / 5.3G, so the third stage has 4 blocks instead of 6
# (28.5M / 4.4G; see docs/mlla.md).
_base_ = './linear-swin-t.py'

model = dict(
    backbone=dict(
        arch=dict(depths=[2, 2, 4, 2]),
        block_design='all',
        expand=2,
        mixer_cfg=dict(value_proj=False)))
