# DinoVim-B (24 bidirectional Mamba-2 blocks, 768 wide) on 224 px images in 16 px
# patches, no stochastic depth: the backbone that the DINO, linear-probe and
# activation-map model files share. Each adds its model type and its readout.
custom_imports = dict(imports=['mmdinomamba'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        type='DinoVim',
        arch='base',
        img_size=224,
        patch_size=16,
        drop_path_rate=0.0))
