# Cascade Mask R-CNN, 1x schedule, with a DINO-pretrained
# DinoMamba-Reg-B (DinoVim-B with 12 register tokens).
_base_ = './_base_/cascade-mask-rcnn_plain-p16_fpn_1x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='DinoVim',
        arch='base',
        num_registers=12,
        out_type='featmap',
        out_indices=[5, 11, 17, 23],
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/dinomamba-reg-base-p16_dino-in1k.pth')))

# twice as many blocks as ViT-B: the same total decay from the head to the embeddings
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.7**(12 / 24)))
