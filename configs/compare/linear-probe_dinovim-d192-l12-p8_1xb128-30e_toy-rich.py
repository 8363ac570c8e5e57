# Linear probe of dino_dinovim-d192-l12-p8_1xb128-20e_toy-rich.py's teacher: the
# official per-layer readout (RMSNorm_f of the mixer output at [CLS]) of the last
# 4 of 12 blocks, as in configs/linear_probe/dinovim-*.
_base_ = './_base_/linear-probe_toy-rich-64px.py'

model = dict(
    backbone=dict(_base_.dinovim_backbone, **_base_.probe_backbone,
                  feature_source='mixer',
                  init_cfg=dict(checkpoint='work_dirs/compare/dinovim/epoch_20.pth')))
