# A miniature mmpretrain ViT (softmax attention) for the mixing-matrix rank tool:
# 4 blocks, width 64, 4 heads of 16 channels.
_base_ = './_base_/mini_p16_128px.py'

model = dict(
    type='mmpretrain.VisionTransformer',
    arch=dict(embed_dims=64, num_layers=4, num_heads=4, feedforward_channels=128))
