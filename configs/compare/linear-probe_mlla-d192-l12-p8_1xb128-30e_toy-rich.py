# Linear probe of dino_mlla-d192-l12-p8_1xb128-20e_toy-rich.py's teacher: the mean
# readout of the last 4 of 12 blocks, each through the final LayerNorm, as the
# LinearViT probe.
_base_ = './_base_/linear-probe_toy-rich-64px.py'

model = dict(
    backbone=dict(_base_.mlla_backbone, **_base_.probe_backbone,
                  feature_source='normed',
                  init_cfg=dict(checkpoint='work_dirs/compare/mlla/epoch_20.pth')))
