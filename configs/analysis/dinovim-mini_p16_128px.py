# A miniature DinoVim for the mixing-matrix rank tool (tools/analysis/mixer_rank.py):
# 4 blocks, width 64, bidirectional SSD mixer with 8 heads of 16 channels, state N = 16.
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    type='DinoVim',
    arch=dict(embed_dims=64, num_layers=4),
    img_size=128,
    patch_size=16,
    drop_path_rate=0.0,
    mixer_cfg=dict(d_state=16, headdim=16))
