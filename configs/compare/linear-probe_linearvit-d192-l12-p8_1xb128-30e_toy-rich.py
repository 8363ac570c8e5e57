# Linear probe of dino_linearvit-d192-l12-p8_1xb128-20e_toy-rich.py's teacher:
# [CLS] of the last 4 of 12 blocks, each through the final LayerNorm, as in
# configs/linear_probe/linearvit-base-p16_4xb128-linear-coslr-100e_in1k.py.
_base_ = './_base_/linear-probe_toy-rich-64px.py'

model = dict(
    backbone=dict(_base_.linearvit_backbone, **_base_.probe_backbone,
                  feature_source='normed',
                  init_cfg=dict(checkpoint='work_dirs/compare/linearvit/epoch_20.pth')))
