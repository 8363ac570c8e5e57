# Linear probe of dino_mlla-d192-l12-p4_1xb64-6e_toy-rich.py's teacher at
# 256 tokens: the readout of linear-probe_mlla-d192-l12-p8_1xb128-30e_toy-rich.py
# (the last 4 of 12 blocks) on the 4 px patching.
_base_ = './_base_/linear-probe_toy-rich-64px-p4.py'

model = dict(
    backbone=dict(_base_.mlla_backbone, **_base_.probe_backbone,
                  feature_source='normed',
                  init_cfg=dict(checkpoint='work_dirs/compare_seq256/mlla/epoch_6.pth')))
