# UperNet on ADE20K (512 x 512, 160k iterations, 8 GPUs x 2 images) with a
# DINO-pretrained LinearViT-B (ViT-B with linear attention, 12 blocks).
_base_ = [
    './_base_/models/upernet_linearvit-base-p16.py',
    './_base_/upernet_8xb2-160k_ade20k-512x512.py',
]
