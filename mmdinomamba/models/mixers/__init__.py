"""Token mixers with one contract: (batch, seqlen, dim) -> (batch, seqlen, dim),
and the mixing-matrix protocol of :mod:`.protocol` (``mixing_info``,
``mixing_matrices(u, hw=None)`` and ``mixing_values(u, hw=None)``: per head,
M X = the mixing). Every mixer takes the token grid ``hw`` the same way; mixers
on a 2-D grid need it, the others ignore it. And :class:`AddLayerNorm`, the residual
add + LayerNorm in front of MLLA's mixer and MLP."""
from .add_layer_norm import AddLayerNorm
from .linear_attention import LinearAttention
from .linear_attention_mixer import LinearAttentionMixer
from .protocol import MIXER_KINDS, MixerInfo, TokenMixer
from .ssd_mixer import SSDMixer

__all__ = ['AddLayerNorm', 'LinearAttention', 'LinearAttentionMixer', 'MIXER_KINDS',
           'MixerInfo', 'SSDMixer', 'TokenMixer']
