# A miniature LinearViT for the mixing-matrix rank tool: 4 blocks, width 64,
# 4 heads of D_QK = 16 channels.
_base_ = './_base_/mini_p16_128px.py'
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(type='LinearViT',
             arch=dict(embed_dims=64, num_layers=4, num_heads=4, mlp_ratio=2))
