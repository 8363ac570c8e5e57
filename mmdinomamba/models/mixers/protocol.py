"""The mixing-matrix protocol every token mixer offers to analysis.

Softmax attention, linear attention and Mamba-2 (SSD) all compute ``Y = M X``
over the token axis, per head. A mixer that follows :class:`TokenMixer` says
what it is (:meth:`~TokenMixer.mixing_info`) and hands out its matrices ``M``
and the values ``X`` they act on, so analysis never looks inside it:

- ``mixing_info() -> MixerInfo``: kind, heads, query/key (or state) width and
  the names of the matrices;
- ``mixing_matrices(u) -> {key: M}``, each M (batch, nheads, seqlen, seqlen);
- ``mixing_values(u) -> {key: X}``, each X (batch, nheads, seqlen, headdim),
  with ``M X`` the mixer's per-head token mixing for that key (what exactly it
  reproduces is documented by each mixer).

``u`` is the mixer's own input, (batch, seqlen, dim). Matrices and values are
computed in the dtype of the mixer's parameters (cast the mixer and ``u`` to
float64 for exact rank work) and in the caller's grad mode: with gradients
enabled they are differentiable in the mixer's parameters and in ``u``, which is
how :mod:`mmdinomamba.analysis.expressivity` fits a mixer's matrix to a target
through this protocol; the measuring helpers of :mod:`mmdinomamba.analysis.mixing`
call them under ``torch.no_grad()``. An implementation therefore must not switch
gradients off itself (no ``@torch.no_grad()``).
"""
from dataclasses import dataclass
from typing import Dict, Protocol, Tuple, runtime_checkable

import torch

Tensor = torch.Tensor

MIXER_KINDS = ('softmax', 'linear', 'ssd')


@dataclass(frozen=True)
class MixerInfo:
    """What the rank bounds need to know about a mixer.

    Attributes:
        kind (str): one of :data:`MIXER_KINDS`.
        nheads (int): heads (matrices per key).
        d_qk (int): query/key channels per head (softmax, linear); for ssd the
            state size N (the width of C and B).
        keys (tuple): names of the matrices ``mixing_matrices`` returns.
    """
    kind: str
    nheads: int
    d_qk: int
    keys: Tuple[str, ...]


@runtime_checkable
class TokenMixer(Protocol):
    """A token mixer ``(batch, seqlen, dim) -> (batch, seqlen, dim)`` whose mixing
    matrices can be materialised (see the module docstring)."""

    def mixing_info(self) -> MixerInfo:
        ...

    def mixing_matrices(self, u: Tensor) -> Dict[str, Tensor]:
        ...

    def mixing_values(self, u: Tensor) -> Dict[str, Tensor]:
        ...
