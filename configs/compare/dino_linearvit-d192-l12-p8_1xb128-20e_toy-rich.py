# DINO on the rich toy data: LinearViT (linear attention), 12 blocks, 192 wide,
# 3 heads, MLP ratio 4, 8 px patches at 64 px (64 patches + [CLS]).
_base_ = './_base_/dino_toy-rich-64px.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='LinearViT',
        arch=dict(embed_dims=192, num_layers=12, num_heads=3, mlp_ratio=4),
        img_size=64,
        patch_size=8,
        out_type='cls_token',
        drop_path_rate=0.0))
