# Baseline + an absolute position embedding: a learnable table per block, added to the
# block's input (the paper's 30M for this row counts one table per block: a single table
# at the stem would add 0.3M, one per block 1.4M).
_base_ = './linear-swin-t.py'

model = dict(backbone=dict(ape=True))
