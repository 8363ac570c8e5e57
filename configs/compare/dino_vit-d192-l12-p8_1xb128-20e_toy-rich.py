# DINO on the rich toy data: mmpretrain's VisionTransformer (softmax attention),
# 12 blocks, 192 wide, 3 heads, 8 px patches at 64 px (64 patches + [CLS]).
_base_ = './_base_/dino_toy-rich-64px.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.VisionTransformer',
        arch=dict(embed_dims=192, num_layers=12, num_heads=3,
                  feedforward_channels=768),
        img_size=64,
        patch_size=8,
        out_type='cls_token',
        drop_path_rate=0.0,
        init_cfg=[
            dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.0),
            dict(type='Constant', layer='LayerNorm', val=1.0, bias=0.0),
        ]))
