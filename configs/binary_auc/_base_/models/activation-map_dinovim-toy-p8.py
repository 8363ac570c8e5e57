# The backbone of configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py (the toy
# DinoVim: 4 blocks, 64 wide, 8 px patches, 8 heads of 8 channels) as an
# ActivationMapModel.
_base_ = ['./activation-map_dinovim-base-p16.py', '../../../_base_/models/dinovim-toy-p8.py']

# chunk_size changes no weight: one chunk would pad 66 tokens to 256
model = dict(backbone=dict(_base_.toy_backbone,
                           mixer_cfg=dict(d_state=16, headdim=16, chunk_size=32)))
