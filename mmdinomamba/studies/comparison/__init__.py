"""Backbones side by side: the measures across models (:mod:`.measures`), their
report (:mod:`.report`), and the DINO recipe on toy data (:mod:`.recipe`) with
its preset table (:mod:`.presets`, data only)."""
from .measures import (ImageSplit, ModelSpec, compare_models, load_model,
                       load_split, measure_backbone, order_word, paired_gain,
                       paired_gains, repo_relative)
from .presets import (COMPARE_MODELS, DEMO_MODELS, PRESETS, SEQ256_MODELS, Preset,
                      RecipeModel)
from .report import write_comparison_report

__all__ = ['COMPARE_MODELS', 'DEMO_MODELS', 'ImageSplit', 'ModelSpec', 'PRESETS',
           'Preset', 'RecipeModel', 'SEQ256_MODELS', 'compare_models', 'load_model',
           'load_split', 'measure_backbone', 'order_word', 'paired_gain',
           'paired_gains', 'repo_relative', 'write_comparison_report']
