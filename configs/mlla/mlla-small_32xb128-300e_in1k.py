# MLLA-S (MILA-S): 84.2 top-1 in the paper without MESA (Tab. 7), 84.4 with it
# (MESA weight 1.5, not part of this recipe). See docs/mlla.md.
_base_ = './mlla-tiny_32xb128-300e_in1k.py'

model = dict(backbone=dict(arch='small', drop_path_rate=0.3))
