# UperNet on ADE20K (512 x 512, 160k iterations, 8 GPUs x 2 images) with a
# DINO-pretrained ViT-B/16 (mmpretrain's VisionTransformer).
_base_ = [
    './_base_/models/upernet_vit-base-p16.py',
    './_base_/upernet_8xb2-160k_ade20k-512x512.py',
]
