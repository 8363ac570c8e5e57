# The backbone of configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py (4 blocks,
# 64 wide, 8 px patches, 8 heads of 8 channels) as an ActivationMapModel.
_base_ = './activation-map_dinovim-base-p16.py'

model = dict(
    backbone=dict(
        arch=dict(_delete_=True, embed_dims=64, num_layers=4),
        img_size=64,
        patch_size=8,
        # chunk_size changes no weight: one chunk would pad 66 tokens to 256
        mixer_cfg=dict(d_state=16, headdim=16, chunk_size=32)))
