"""mmpretrain data transforms (need mmpretrain)."""
from .color_jitter import HueSafeColorJitter, adjust_hue, adjust_saturation
from .dino_multicrop import DINOMultiCrop, dino_view_pipeline
from .label_map import LoadRGBLabelMap

__all__ = ['DINOMultiCrop', 'HueSafeColorJitter', 'LoadRGBLabelMap', 'adjust_hue',
           'adjust_saturation', 'dino_view_pipeline']
