# The architecture of the official reduced-depth reference model
# (tests/data/official_vim_d256_depth4.pt): DinoVim-T width, 4 blocks, the
# default mixer (N = 64, headdim 64). Pass that file as CHECKPOINT to the rank tool.
_base_ = ['./dinovim-mini_p16_128px.py']

model = dict(
    arch=dict(embed_dims=256, num_layers=4),
    img_size=224,
    mixer_cfg=dict(_delete_=True))
