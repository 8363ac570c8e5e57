"""Token mixers with one contract: (batch, seqlen, dim) -> (batch, seqlen, dim),
and ``mixing_matrices(u)`` returning each (batch, nheads, seqlen, seqlen) matrix M."""
from .linear_attention import LinearAttention
from .ssd_mixer import SSDMixer

__all__ = ['LinearAttention', 'SSDMixer']
