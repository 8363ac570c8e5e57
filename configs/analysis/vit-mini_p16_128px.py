# A miniature mmpretrain ViT (softmax attention) for the mixing-matrix rank tool:
# 4 blocks, width 64, 4 heads of 16 channels.
model = dict(
    type='mmpretrain.VisionTransformer',
    arch=dict(embed_dims=64, num_layers=4, num_heads=4, feedforward_channels=128),
    img_size=128,
    patch_size=16,
    drop_path_rate=0.0)
