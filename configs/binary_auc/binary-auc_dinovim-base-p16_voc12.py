# Binary-AUC of DinoVim-B on PASCAL VOC 2012 val, through mmseg's dataset.
_base_ = [
    './_base_/models/activation-map_dinovim-base-p16.py',
    './_base_/datasets/voc12_bs32_224px.py',
]
