"""Analysis tools: activation maps, mixing-matrix materialisation, rank measures."""
from .activation_maps import (ActivationMaps, activation_maps, cosine_similarity_maps,
                              layer_activation_maps, layer_tokens, token_layout,
                              upsample_maps)
from .mixing import (MIXER_KINDS, MixerInfo, capture_mixer_inputs, find_mixer,
                     mixer_info, mixer_kind, mixing_matrices, mixing_values,
                     softmax_attention_matrix, ssd_decay_masks)
from .mixing_rank import RankReport, analyse_backbone, write_report
from .rank import (block_rank_summary, block_ranks, effective_rank, numerical_rank,
                   rank_measures, singular_values)

__all__ = [
    'ActivationMaps', 'activation_maps', 'cosine_similarity_maps',
    'layer_activation_maps', 'layer_tokens', 'token_layout', 'upsample_maps',
    'MIXER_KINDS', 'MixerInfo', 'RankReport', 'analyse_backbone', 'block_rank_summary',
    'block_ranks', 'capture_mixer_inputs', 'effective_rank', 'find_mixer', 'mixer_info',
    'mixer_kind', 'mixing_matrices', 'mixing_values', 'numerical_rank', 'rank_measures',
    'singular_values', 'softmax_attention_matrix', 'ssd_decay_masks', 'write_report'
]
