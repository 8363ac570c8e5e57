"""Token mixers with one contract: (batch, seqlen, dim) -> (batch, seqlen, dim),
and the mixing-matrix protocol of :mod:`.protocol` (``mixing_info``,
``mixing_matrices(u)`` and ``mixing_values(u)``: per head, M X = the mixing)."""
from .linear_attention import LinearAttention
from .protocol import MIXER_KINDS, MixerInfo, TokenMixer
from .ssd_mixer import SSDMixer

__all__ = ['LinearAttention', 'MIXER_KINDS', 'MixerInfo', 'SSDMixer', 'TokenMixer']
