# A miniature DinoVim for the mixing-matrix rank tool (tools/analysis/mixer_rank.py):
# 4 blocks, width 64, bidirectional SSD mixer with 8 heads of 16 channels, state N = 16.
_base_ = './_base_/mini_p16_128px.py'
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(type='DinoVim', arch=dict(embed_dims=64, num_layers=4),
             mixer_cfg=dict(d_state=16, headdim=16))
