# MLLA-B (MILA-B): 85.0 top-1 in the paper without MESA (Tab. 7), 85.3 with it
# (MESA weight 2.0, not part of this recipe). See docs/mlla.md.
_base_ = './mlla-tiny_32xb128-300e_in1k.py'

model = dict(backbone=dict(arch='base', drop_path_rate=0.5), head=dict(in_channels=768))
