# The toy DinoVim, as a delta on a DinoVim-B backbone (`model.backbone`): 4 blocks,
# 64 wide, 8 px patches at 64 px (64 patches + the two [CLS] slots), state 16,
# heads of 16 channels. The toy DINO run, its linear probe and its Binary-AUC
# configs read it as `dict(**_base_.toy_backbone, ...)`.
toy_backbone = dict(
    arch=dict(_delete_=True, embed_dims=64, num_layers=4),
    img_size=64,
    patch_size=8,
    # the whole matrix per head: 66 tokens fit it, with no chunk padding
    mixer_cfg=dict(d_state=16, headdim=16, ssd_backend='quadratic'))
