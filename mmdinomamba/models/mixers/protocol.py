"""The mixing-matrix protocol every token mixer offers to analysis.

Softmax attention, linear attention, Mamba-2 (SSD) and MLLA's linear attention
all compute ``Y = M X`` over the token axis, per head (MLLA's whole matrix per
channel). A mixer that follows :class:`TokenMixer` says
what it is (:meth:`~TokenMixer.mixing_info`) and hands out its matrices ``M``
and the values ``X`` they act on, so analysis never looks inside it:

- ``mixing_info() -> MixerInfo``: kind, heads, query/key (or state) width and
  the names of the matrices;
- ``mixing_matrices(u, hw=None) -> {key: M}``, each M (batch, nheads, seqlen,
  seqlen);
- ``mixing_values(u, hw=None) -> {key: X}``, each X (batch, nheads, seqlen, headdim),
  with ``M X`` the mixer's per-head token mixing for that key (what exactly it
  reproduces is documented by each mixer).

``u`` is the mixer's own input, (batch, seqlen, dim). Every mixer takes the
token grid the same way, in ``forward(u, hw=None)``, ``mixing_matrices(u,
hw=None)`` and ``mixing_values(u, hw=None)``, with ``hw = (height, width)`` and
the tokens in raster order: a mixer whose tokens lie on a 2-D grid
(``MixerInfo.grid``: positional encodings, convolutions over the grid) needs it
and says so when it is missing (:func:`require_grid`); the others ignore it, so
a caller passes the grid it has without asking which kind it holds. A matrix may be per channel rather than per head (MLLA's ``'whole'``:
(batch, dim, seqlen, seqlen) with X (batch, dim, seqlen, 1)); its second axis
says how many there are. Matrices and values are computed in the dtype of the
mixer's parameters (cast the mixer and ``u`` to float64 for exact rank work) and
in the caller's grad mode: with gradients enabled they are differentiable in the
mixer's parameters and in ``u``, which is how
:mod:`mmdinomamba.studies.expressivity.probe` fits a mixer's matrix to a target
through this protocol; the measuring helpers of :mod:`mmdinomamba.analysis.mixing`
call them under ``torch.no_grad()``. An implementation therefore must not switch
gradients off itself (no ``@torch.no_grad()``).
"""
from dataclasses import dataclass
from typing import Dict, Optional, Protocol, Tuple, runtime_checkable

import torch

Tensor = torch.Tensor
Grid = Tuple[int, int]

MIXER_KINDS = ('softmax', 'linear', 'ssd', 'mlla')


@dataclass(frozen=True)
class MixerInfo:
    """What the rank bounds need to know about a mixer.

    Attributes:
        kind (str): one of :data:`MIXER_KINDS`: 'softmax', 'linear' (rank <=
            d_qk), 'ssd' (causal, N-semiseparable), 'mlla' (linear attention per
            head, key 'attention', plus per-channel local terms, key 'whole').
        nheads (int): heads (matrices per key; a per-channel key has more).
        d_qk (int): query/key channels per head (softmax, linear, mlla); for ssd
            the state size N (the width of C and B).
        keys (tuple): names of the matrices ``mixing_matrices`` returns.
        grid (bool): the mixer takes the token grid ``hw`` (see the module
            docstring). Defaults to False.
        causal (bool): an 'mlla' attention part carries a forget gate's causal
            decay mask (d_qk-semiseparable, generically full rank). Defaults to
            False.
        local_kernel (int): side k of the per-channel depthwise k x k stencil in
            'whole' (LePE), 0 when there is none; it reaches ``(k // 2) * (W + 1)``
            raster positions from the diagonal on a W-wide grid. Defaults to 0.
    """
    kind: str
    nheads: int
    d_qk: int
    keys: Tuple[str, ...]
    grid: bool = False
    causal: bool = False
    local_kernel: int = 0


@runtime_checkable
class TokenMixer(Protocol):
    """A token mixer ``(batch, seqlen, dim) -> (batch, seqlen, dim)`` whose mixing
    matrices can be materialised (see the module docstring)."""

    def mixing_info(self) -> MixerInfo:
        ...

    def forward(self, u: Tensor, hw: Optional[Grid] = None) -> Tensor:
        ...

    def mixing_matrices(self, u: Tensor, hw: Optional[Grid] = None) -> Dict[str, Tensor]:
        ...

    def mixing_values(self, u: Tensor, hw: Optional[Grid] = None) -> Dict[str, Tensor]:
        ...


def require_grid(hw: Optional[Grid], seqlen: int, who: str) -> Grid:
    """``hw`` as (height, width) ints, checked to hold ``seqlen`` tokens: for a
    mixer that needs the grid.

    Raises:
        ValueError: ``hw`` is missing, not two positive ints, or of another size.
    """
    if hw is None:
        raise ValueError(f'{who} works on a token grid: pass hw=(height, width) '
                         '(capture_mixer_calls or forward_intermediates gives it)')
    if len(hw) != 2 or int(hw[0]) < 1 or int(hw[1]) < 1:
        raise ValueError(f'{who}: hw must be a grid (height, width) of positive '
                         f'ints, got {hw!r}')
    h, w = int(hw[0]), int(hw[1])
    if h * w != seqlen:
        raise ValueError(f'{who}: {seqlen} tokens do not fill the grid hw={(h, w)}')
    return h, w
