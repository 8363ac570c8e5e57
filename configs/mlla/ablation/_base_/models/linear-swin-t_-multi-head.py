# Baseline - the multi-head design: one head whose Q and K are 32 wide (a head's width)
# and shared by every value channel, as Mamba's B and C are; V keeps the full width. The
# paper's 24M / 3.9G single out this reading (with Q and K at full width it would be 28M
# / 5.0G).
_base_ = './linear-swin-t.py'

model = dict(backbone=dict(arch=dict(num_heads=[1, 1, 1, 1]), mixer_cfg=dict(qk_dim=32)))
