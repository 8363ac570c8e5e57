# What the miniature backbones for the rank tool share: 128 px images in 16 px
# patches (64 tokens), no stochastic depth. Each config adds its type and arch.
model = dict(img_size=128, patch_size=16, drop_path_rate=0.0)
