"""Datasets and data generators (numpy, Pillow and mmengine only)."""
from .label_maps import (IMAGENET_S_IGNORE_INDEX, decode_rgb_label_map,
                         encode_rgb_label_map, read_label_map)
from .toy import (RICH_SHAPES, RICH_TEXTURES, SHAPES, STYLES, ToyObject,
                  make_toy_dataset, mask_to_rle, render_rich_sample,
                  render_toy_sample, toy_class_names)

__all__ = [
    'IMAGENET_S_IGNORE_INDEX', 'decode_rgb_label_map', 'encode_rgb_label_map',
    'read_label_map',
    'RICH_SHAPES', 'RICH_TEXTURES', 'SHAPES', 'STYLES', 'ToyObject',
    'render_rich_sample', 'make_toy_dataset', 'mask_to_rle',
    'render_toy_sample', 'toy_class_names'
]
