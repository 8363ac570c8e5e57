# Cascade Mask R-CNN with a DINO-pretrained DinoMamba-Reg-B (DinoVim-B with 12
# register tokens).
_base_ = './cascade-mask-rcnn_dinovim-base-p16_fpn.py'

model = dict(backbone=dict(num_registers=12, init_cfg=dict(
    checkpoint='checkpoints/dinomamba-reg-base-p16_dino-in1k.pth')))
