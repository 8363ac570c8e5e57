# The four backbones of the small comparison recipe, written once: the shared DINO
# and probe fragments (dino_toy-rich-64px.py, linear-probe_toy-rich-64px.py) inherit
# them, and each DINO config (dino_*.py) and linear probe (linear-probe_*.py) picks
# its own. Same width (192), depth (12) and patching (8 px at 64 px: 64 patches, + [CLS]
# where the model has one); only the block and its token mixer differ.

# What the four share: width and depth, the 64 px input in 8 px patches, the
# [CLS] (or mean) readout, no stochastic depth. (Names with two leading
# underscores are this file's own: they stay out of the merged configs.)
__arch = dict(embed_dims=192, num_layers=12)
__layout = dict(img_size=64, patch_size=8, out_type='cls_token', drop_path_rate=0.0)

# mmpretrain's VisionTransformer (softmax attention), 3 heads, MLP 768
vit_backbone = dict(
    type='mmpretrain.VisionTransformer',
    arch=dict(__arch, num_heads=3, feedforward_channels=768),
    **__layout,
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.0),
        dict(type='Constant', layer='LayerNorm', val=1.0, bias=0.0),
    ])
# DinoVim (bidirectional Mamba-2): d_inner 384 = 6 heads of 64, state 64, two
# [CLS] slots
dinovim_backbone = dict(type='DinoVim', arch=dict(__arch), **__layout)
# LinearViT (linear attention), 3 heads, MLP ratio 4
linearvit_backbone = dict(type='LinearViT', arch=dict(__arch, num_heads=3, mlp_ratio=4),
                          **__layout)
# MLLA's block and mixer on the same plain layout (PlainMLLA): CPE, the SiLU-gated
# linear attention with RoPE and LePE, the MLP; 6 heads of 32 (MLLA's head width),
# MLP ratio 4. No [CLS] and no position table (CPE, RoPE and LePE carry position):
# the readout is the mean of the 64 patch tokens, as MLLA pools.
mlla_backbone = dict(type='PlainMLLA', arch=dict(__arch, num_heads=6, mlp_ratio=4),
                     **__layout)
