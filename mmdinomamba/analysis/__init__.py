"""Analysis tools, the measures on one model: activation maps, mixing-matrix
materialisation, rank measures, FLOPs (the studies across models that use them:
:mod:`mmdinomamba.studies`).

Everything here reads models through one API (:mod:`.adapters`): a backbone's
``forward_intermediates`` / ``token_mixer`` and a mixer's ``mixing_info`` /
``mixing_matrices`` / ``mixing_values``; mmpretrain's ViT gets it from an adapter.
"""
from .activation_map_model import ActivationMapModel
from .activation_maps import (ActivationMaps, activation_maps, cosine_similarity_maps,
                              layer_activation_maps, layer_tokens, token_layout,
                              upsample_maps)
from .adapters import MMPretrainAttention, MMPretrainViT, as_backbone, as_mixer
from .flops import Complexity, count_macs, model_complexity
from .loading import load_backbone
from .mixing import (MIXER_KINDS, MixerInfo, capture_mixer_inputs, find_mixer,
                     mixer_info, mixer_kind, mixing_matrices, mixing_values,
                     softmax_attention_matrix, ssd_decay_masks)
from .mixing_rank import RankReport, analyse_backbone
from .rank import (block_rank_summary, block_ranks, effective_rank, numerical_rank,
                   rank_measures, singular_values)
from .rank_report import format_table, write_report

__all__ = [
    'ActivationMapModel', 'ActivationMaps', 'Complexity', 'MIXER_KINDS',
    'MMPretrainAttention', 'MMPretrainViT', 'MixerInfo', 'RankReport',
    'activation_maps', 'analyse_backbone', 'as_backbone', 'as_mixer',
    'block_rank_summary', 'block_ranks', 'capture_mixer_inputs',
    'cosine_similarity_maps', 'count_macs', 'effective_rank', 'find_mixer',
    'format_table', 'layer_activation_maps', 'layer_tokens', 'load_backbone',
    'mixer_info', 'mixer_kind', 'mixing_matrices', 'mixing_values',
    'model_complexity', 'numerical_rank', 'rank_measures', 'singular_values',
    'softmax_attention_matrix', 'ssd_decay_masks', 'token_layout', 'upsample_maps',
    'write_report'
]
