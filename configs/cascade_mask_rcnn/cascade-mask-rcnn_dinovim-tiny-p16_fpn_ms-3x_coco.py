# Cascade Mask R-CNN, 3x schedule, multi-scale training, with a DINO-pretrained
# DinoVim-T (24 bidirectional Mamba-2 blocks, 256 wide).
_base_ = './_base_/cascade-mask-rcnn_plain-p16_fpn_ms-3x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='DinoVim',
        arch='tiny',
        out_type='featmap',
        out_indices=[5, 11, 17, 23],
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/dinovim-tiny-p16_dino-in1k.pth')),
    neck=[
        dict(
            type='mmseg.Feature2Pyramid',
            embed_dim=256,
            rescales=[4, 2, 1, 0.5],
            norm_cfg=dict(type='SyncBN', requires_grad=True)),
        dict(
            type='FPN',
            in_channels=[256, 256, 256, 256],
            out_channels=256,
            num_outs=5),
    ])

# twice as many blocks as ViT-B: the same total decay from the head to the embeddings
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.7**(12 / 24)))
