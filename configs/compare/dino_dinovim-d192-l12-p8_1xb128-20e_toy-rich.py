# DINO on the rich toy data: DinoVim (bidirectional Mamba-2), 12 blocks, 192 wide
# (d_inner 384 = 6 heads of 64, state 64), 8 px patches at 64 px (64 patches + the
# two [CLS] slots).
_base_ = './_base_/dino_toy-rich-64px.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='DinoVim',
        arch=dict(embed_dims=192, num_layers=12),
        img_size=64,
        patch_size=8,
        out_type='cls_token',
        drop_path_rate=0.0))
