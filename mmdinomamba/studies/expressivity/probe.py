"""The expressivity probe: how closely can a token mixer's matrix M match a target T?

The paper bounds the rank of each mixer's matrix (softmax > SSD > linear
attention). The probe measures it end to end: for a mixer family, a width and a
target matrix T (seqlen x seqlen, :mod:`.targets`) it fits the
mixer's parameters so that the mixer's own M matches T, and reports the relative
error ``||M - T||_F / ||T||_F`` as an interval: a certified lower bound
(:func:`family_floors`) and the best fit found.

The model fitted (:class:`ProbeModel`), for a family of :data:`FAMILIES`, width
w (D_QK or the state size N) and H heads::

    u   = X P                          X (seqlen, feature_dim): fixed token features;
                                       P (feature_dim, H w): learned
    M_h = mean_k mixing_matrices(u)[k] the family's keys k, head h
    M   = sum_h a_h M_h                a (H,): learned head weights

- M is the mixer's own: the mixing-matrix protocol
  (:class:`~mmdinomamba.models.mixers.TokenMixer`) called with gradients on, so
  the fit runs through the code the rank tool measures.
- The token features X are fixed (:func:`token_features`: i.i.d. N(0, 1),
  ``feature_dim`` wide, the same for every family, restart and width; with
  ``inputs='positional'`` the first columns are the tokens' grid coordinates,
  :func:`position_features`); the
  learned embedding P plays the previous layer's projection into the mixer's
  width. As in a network whose tokens are ``feature_dim`` wide, the mixer's
  queries and keys (B and C) lie in a ``feature_dim``-dimensional space.
  (Free per-token inputs, X = I, make the fit badly conditioned: self-fits
  stall at 1e-2 to 1e-1; docs/expressivity.md.)
- Heads: with each head's value path carrying the same features, a layer mixes
  tokens by ``sum_h a_h M_h`` (the output projection's share of each head).
  With one head ``a`` is a scale. A family whose matrices are per channel
  (MLLA with LePE: attention plus each channel's 3 x 3 stencil) gets one
  weight per channel in the same way. A mixer on a token grid gets the grid
  :func:`~.targets.grid_shape` (L), tokens in raster order.
- Fit (:func:`fit_matrix`): minimise ``||M - T||_F^2 / ||T||_F^2`` in float32
  from several starts (the family's constructive start, :data:`STARTS`; a
  contained family's fit, :func:`nested_state`; a warm start; random draws;
  a start the optimiser leaves worse keeps its initialisation), each within
  ``steps`` evaluations (a forward and
  backward pass each); the best start then goes on in rounds of doubling
  budget until a round gains less than ``tol`` (the convergence rule). Within
  each: Adam (lr
  0.03 falling along a cosine, keeping the best parameters it saw) spends a
  quarter of the budget moving off the initialisation; then L-BFGS (strong Wolfe line
  search, history 50) converges, in coordinates scaled by Adam's second moments
  (``p = p0 + z / sqrt(v)``: a diagonal preconditioner, since the embedding,
  the projections and the SSD's decay parameters live on different scales).
  When L-BFGS stops early, Adam takes over again; the fit ends once such a
  round gains less than 1 %. The best parameters seen are kept, and their error
  is recomputed in float64. Random start r draws its initialisation with seed
  ``seed + r``. A family with a ``linear_part`` (MLLA with LePE) has its
  heads' scales and its kernel solved by least squares at every evaluation
  (variable projection, :meth:`ProbeModel.project`) and written back at the
  end (:meth:`ProbeModel.set_linear_part`): the error is the mixer's own M's.
- A fit is an upper bound on the best error the family can reach; the floors
  of :func:`family_floors` are lower bounds; a fit above 1 (the zero matrix's
  error) is "no fit" (:attr:`FitResult.reported`).

Families (:data:`FAMILIES`; a new mixer is one row):

=================  ==================================================  ========  ========
family             mixer (model width H w)                             rank(M)   block
=================  ==================================================  ========  ========
softmax            mmpretrain ``MultiheadAttention``                   L         L / 2
linear             :class:`~mmdinomamba.models.mixers.LinearAttention`  <= H w    <= H w
ssd_causal         :class:`~mmdinomamba.models.mixers.SSDMixer`,        L         <= H w
                   ``d_state=w``, ``headdim=2 w``, one direction
ssd_bidirectional  the same, both directions, M = (M_fwd + M_bwd) / 2  L         <= H w
mlla               :class:`~mmdinomamba.models.mixers.LinearAttentionMixer`  <= H w    <= H w
                   ``rope=True``: MLLA's attention without LePE
mlla_lepe          the same with ``lepe=True``, key ``'whole'``        L         (*)
=================  ==================================================  ========  ========

(*) the LePE stencil reaches W + 1 raster positions (W the grid's width): the
block below the diagonal has rank <= H w + W + 1 (no floor drawn).

"block" is the block strictly below the diagonal
(:func:`~.targets.offdiag_block`). The SSD's bound there is N per
head: Mamba-2's decay is one scalar per head and token, so its mask has rank 1
on that block (docs/rank_analysis.md).
"""
import copy
import math
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from mmdinomamba.models.mixers.positional import depthwise_conv_matrix
from mmdinomamba.analysis.adapters import as_mixer
from .targets import (causal_floor, check_target, grid_shape, offdiag_block,
                      rank_floors, row_sum_floor, semiseparable_floor)

Tensor = torch.Tensor

__all__ = ['CONTAINS', 'FAMILIES', 'Family', 'FitResult', 'INPUTS', 'ProbeModel',
           'check_device', 'check_family', 'check_fit_args', 'contained_cells',
           'family_floors', 'fit_matrix', 'has_offdiag_block', 'nested_state', 'nests',
           'position_features',
           'probe_memory_bytes', 'sample_matrix', 'token_features']


# --------------------------------------------------------------------------- #
# Families
# --------------------------------------------------------------------------- #
def _softmax(width: int, heads: int) -> nn.Module:
    from mmpretrain.models.utils.attention import MultiheadAttention
    return MultiheadAttention(embed_dims=width * heads, num_heads=heads)


def _linear(width: int, heads: int) -> nn.Module:
    from mmdinomamba.models.mixers import LinearAttention
    return LinearAttention(width * heads, heads)


def _mlla(width: int, heads: int, lepe: bool) -> nn.Module:
    from mmdinomamba.models.mixers import LinearAttentionMixer
    return LinearAttentionMixer(width * heads, heads, rope=True, lepe=lepe)


def _ssd(width: int, heads: int, bidirectional: bool) -> nn.Module:
    from mmdinomamba.models.mixers import SSDMixer
    # expand 2: inner width 2 H N = H heads of 2 N channels (the channels act on
    # the values only, not on M). Steps drawn in [0.01, 1] instead of Mamba's
    # [0.001, 0.1]: the family is the same, but at Mamba's initialisation the
    # skip D = 1 outweighs the rest of M a hundredfold, a poor start for a fit.
    return SSDMixer(width * heads, d_state=width, headdim=2 * width, dt_min=0.01,
                    dt_max=1.0, bidirectional=bidirectional)


@dataclass(frozen=True)
class Family:
    """One row of :data:`FAMILIES`.

    Attributes:
        build (callable): ``(width, heads) -> mixer``, a module with the
            mixing-matrix protocol whose input is ``heads * width`` wide.
        keys (tuple): the matrices of ``mixing_matrices`` averaged into M.
        width_name (str): what the width is ('D_QK', 'N').
        rank (callable, optional): ``(width, heads) -> r``, a bound on rank(M);
            None if M can have full rank.
        block_rank (callable, optional): ``(width, heads) -> r``, a bound on the
            rank of the block strictly below the diagonal; None if none.
        causal (bool): M is lower triangular (the report draws the causal floor).
        bytes_per_entry (int): memory a fit holds per entry of one matrix of
            one key (:func:`probe_memory_bytes`).
        description (str): one line for the report.
        per_channel (bool): the keys' matrices are one per channel
            (``heads * width`` of them, MLLA's ``'whole'``), not one per head;
            M weighs each with its own learned weight. Defaults to False.
        linear_part (bool): M is ``sum_h s_h A_h + P(kappa)``, linear in the
            heads' scales s and one depthwise k x k kernel kappa (a per-channel
            family whose channel c adds its stencil ``P(K_c)`` to its head's
            ``'attention'`` A_h: ``s_h = sum_(c in h) a_c``,
            ``kappa = sum_c a_c K_c``). The fit solves (s, kappa) by least
            squares at every evaluation (:meth:`ProbeModel.project`).
            Defaults to False.
    """
    build: Callable[[int, int], nn.Module]
    keys: Tuple[str, ...]
    width_name: str
    rank: Optional[Callable[[int, int], int]]
    block_rank: Optional[Callable[[int, int], int]]
    causal: bool
    bytes_per_entry: int
    description: str
    per_channel: bool = False
    linear_part: bool = False

    def matrices(self, width: int, heads: int) -> int:
        """How many matrices each key has (heads, or channels if per_channel)."""
        return width * heads if self.per_channel else heads


def _heads_times_width(width: int, heads: int) -> int:
    return width * heads


FAMILIES: Dict[str, Family] = {
    'softmax': Family(
        build=_softmax, keys=('attention', ), width_name='D_QK', rank=None,
        block_rank=None, causal=False, bytes_per_entry=128,
        description='softmax attention (mmpretrain MultiheadAttention)'),
    'linear': Family(
        build=_linear, keys=('attention', ), width_name='D_QK',
        rank=_heads_times_width, block_rank=_heads_times_width, causal=False,
        bytes_per_entry=128,
        description='linear attention, phi = softmax over channels (LinearAttention)'),
    'ssd_causal': Family(
        build=partial(_ssd, bidirectional=False), keys=('forward', ), width_name='N',
        rank=None, block_rank=_heads_times_width, causal=True, bytes_per_entry=160,
        description='Mamba-2 SSD, causal (SSDMixer)'),
    'ssd_bidirectional': Family(
        build=partial(_ssd, bidirectional=True), keys=('forward', 'backward'),
        width_name='N', rank=None, block_rank=_heads_times_width, causal=False,
        bytes_per_entry=160,
        description='Mamba-2 SSD, bidirectional (SSDMixer, bimamba v2)'),
    'mlla': Family(
        build=partial(_mlla, lepe=False), keys=('attention', ), width_name='D_QK',
        rank=_heads_times_width, block_rank=_heads_times_width, causal=False,
        bytes_per_entry=128,
        description="MLLA's attention without LePE: ELU + 1, RoPE 2-D "
        '(LinearAttentionMixer)'),
    'mlla_lepe': Family(
        build=partial(_mlla, lepe=True), keys=('whole', ), width_name='D_QK',
        rank=None, block_rank=None, causal=False, bytes_per_entry=48,
        per_channel=True, linear_part=True,
        description="MLLA's attention with LePE (3 x 3 depthwise conv of V; "
        'LinearAttentionMixer)'),
}


def check_family(name: str) -> Family:
    """The row of :data:`FAMILIES` called ``name``, or a ValueError naming the
    choices."""
    if name not in FAMILIES:
        raise ValueError(f'unknown mixer family {name!r}; choose one of '
                         f'{sorted(FAMILIES)}')
    return FAMILIES[name]


def check_device(device) -> torch.device:
    """``device`` as a torch.device, or a ValueError if it names no device this
    process can use (a CUDA device without CUDA, or beyond the devices seen)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f'unknown device {device!r} ({err}); use e.g. cpu or cuda:0')
    if dev.type == 'cuda' and (not torch.cuda.is_available() or
                               (dev.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f'device {device!r} is not available here '
                         f'({torch.cuda.device_count()} CUDA device(s) seen); use cpu')
    if dev.type not in ('cpu', 'cuda'):
        raise ValueError(f'device {device!r}: the probe runs on cpu or cuda')
    return dev


def _check_size(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f'{name} must be a positive int, got {value!r}')


# --------------------------------------------------------------------------- #
# The model fitted
# --------------------------------------------------------------------------- #
INPUTS = ('random', 'positional')
# octaves of the sines and cosines of each grid coordinate in positional inputs
POSITION_OCTAVES = 4


def position_features(seqlen: int) -> Tensor:
    """The positional content of a token on the grid :func:`grid_shape` (L), in
    raster order: its coordinates (row, column) scaled to [-1, 1] and
    ``sin(2^o pi c / 2), cos(2^o pi c / 2)`` of each coordinate c for octaves
    o < :data:`POSITION_OCTAVES`, each column scaled to unit mean square:
    (seqlen, 2 + 4 POSITION_OCTAVES) float32."""
    h, w = grid_shape(seqlen)
    idx = torch.arange(seqlen, dtype=torch.float64)
    coords = []
    for c, n in ((torch.div(idx, w, rounding_mode='floor'), h), (idx % w, w)):
        coords.append(2 * c / max(n - 1, 1) - 1)
    cols = list(coords)
    for o in range(POSITION_OCTAVES):
        for c in coords:
            cols += [torch.sin(2 ** o * math.pi * c / 2), torch.cos(2 ** o * math.pi * c / 2)]
    F = torch.stack(cols, 1)
    rms = F.pow(2).mean(0).sqrt().clamp(min=1e-12)
    return (F / rms).float()


def token_features(seqlen: int, feature_dim: int, seed: int = 0,
                   inputs: str = 'random') -> Tensor:
    """The fixed token features X: (seqlen, feature_dim) float32.

    'random': i.i.d. N(0, 1) from ``torch.Generator().manual_seed(seed)``;
    'positional': the same with its first ``2 + 4 POSITION_OCTAVES`` columns
    replaced by :func:`position_features` (the tokens' grid coordinates), so
    that the queries and keys can depend on position at every L (random
    features carry none beyond L = feature_dim)."""
    _check_size('seqlen', seqlen)
    _check_size('feature_dim', feature_dim)
    if inputs not in INPUTS:
        raise ValueError(f'unknown inputs {inputs!r}; choose one of {list(INPUTS)}')
    X = torch.randn(seqlen, feature_dim, generator=torch.Generator().manual_seed(seed))
    if inputs == 'positional':
        P = position_features(seqlen)
        if P.shape[1] > feature_dim:
            raise ValueError(f'positional inputs need feature_dim >= {P.shape[1]}, '
                             f'got {feature_dim}')
        X[:, :P.shape[1]] = P
    return X


class ProbeModel(nn.Module):
    """Fixed features, learned embedding, one mixer, head weights -> M (module
    docstring).

    Args:
        family (str): a key of :data:`FAMILIES`.
        width (int): D_QK or N.
        heads (int): H.
        features (Tensor): X, (seqlen, feature_dim), kept fixed (a buffer).
    """

    def __init__(self, family: str, width: int, heads: int, features: Tensor):
        super().__init__()
        self.family = check_family(family)
        if features.dim() != 2:
            raise ValueError('features must have shape (seqlen, feature_dim), got '
                             f'{tuple(features.shape)}')
        self.register_buffer('features', features.detach().clone().float())
        # P: u = X P has N(0, 1) entries at initialisation, like normed tokens
        self.embed = nn.Linear(features.shape[1], width * heads, bias=False)
        nn.init.normal_(self.embed.weight, std=features.shape[1] ** -0.5)
        self.mixer = self.family.build(width, heads)
        count = self.family.matrices(width, heads)
        self.head_weights = nn.Parameter(torch.full((count, ), 1.0 / count))
        mixer = as_mixer(self.mixer)
        self.grid = grid_shape(features.shape[0])  # mixers without a grid ignore it
        self.target: Optional[Tensor] = None
        if self.family.linear_part:
            # P(kappa) = sum_ab kappa_ab S_ab: the k^2 unit stencils on the grid
            k = mixer.mixing_info().local_kernel
            unit = torch.eye(k * k).view(k * k, 1, k, k)
            self.register_buffer('stencils', depthwise_conv_matrix(unit, self.grid),
                                 persistent=False)

    def forward(self) -> Tensor:
        """M, (seqlen, seqlen), differentiable in every parameter; while
        :meth:`project` holds a target, the M of the best (s, kappa) instead."""
        u = self.embed(self.features)[None]
        mats = as_mixer(self.mixer).mixing_matrices(u, self.grid)
        if self.target is not None:
            basis = self._linear_basis(mats)
            return torch.einsum('k,kij->ij', self._solve(basis), basis)
        M = torch.stack([mats[k][0] for k in self.family.keys]).mean(0)
        return torch.einsum('h,hij->ij', self.head_weights.to(M.dtype), M)

    def _linear_basis(self, mats: Dict[str, Tensor]) -> Tensor:
        """[A_1 .. A_H, S_1 .. S_(k^2)], (H + k^2, seqlen, seqlen)."""
        A = mats['attention'][0]
        return torch.cat([A, self.stencils.to(A.dtype)])

    def _solve(self, basis: Tensor) -> Tensor:
        """The coefficients of ``basis`` closest to the target in Frobenius
        norm (least squares in float64, no gradient: at the optimum the loss's
        gradient in them is zero, so the other parameters' gradient is that of
        the projected loss), (len(basis), ) in basis's dtype."""
        with torch.no_grad():
            B = basis.reshape(basis.shape[0], -1).T.double()
            t = self.target.reshape(-1, 1).double()
            return torch.linalg.lstsq(B, t).solution[:, 0].to(basis.dtype)

    def project(self, target: Optional[Tensor]) -> None:
        """Variable projection, for a family with ``linear_part``: until
        called with None, :meth:`forward` returns ``sum_h s_h A_h + P(kappa)``
        with (s, kappa) solved by least squares against ``target`` (seqlen,
        seqlen) at each call, so that a fit moves only the attention's
        parameters. (With s and kappa as the head weights and kernels, a fit
        stalls: the stencils hold most of a target's energy, and each weight
        a_c scales both its channel's stencil and the attention.)"""
        if target is not None and not self.family.linear_part:
            raise ValueError(f'{self.family.description}: M has no linear part to '
                             'solve for; fit it without project')
        self.target = target

    @torch.no_grad()
    def set_linear_part(self) -> None:
        """Write the (s, kappa) that :meth:`project` solves into the head
        weights a and the LePE kernels K, then stop projecting; :meth:`forward`
        is then the mixer's own M, the same matrix::

            a_c = s_h / e + z_c / C     z: +-1 by channel, centred in each head
                                        (e channels a head, C in all)
            K_c = a_c kappa / ||a||^2   so sum_c a_c K_c = kappa
        """
        u = self.embed(self.features)[None]
        mats = as_mixer(self.mixer).mixing_matrices(u, self.grid)
        basis = self._linear_basis(mats)
        coef = self._solve(basis)
        heads = mats['attention'].shape[1]
        scales, kappa = coef[:heads], coef[heads:]
        count = self.head_weights.numel()
        per_head = count // heads
        z = (-1.0) ** torch.arange(per_head, device=coef.device, dtype=coef.dtype)
        a = scales.repeat_interleave(per_head) / per_head + \
            (z - z.mean()).repeat(heads) / count
        norm = a.pow(2).sum()
        kernels = a[:, None] * kappa / norm if norm > 0 else torch.zeros_like(
            a[:, None] * kappa)
        lepe = self.mixer.lepe.weight
        self.head_weights.copy_(a)
        lepe.copy_(kernels.view_as(lepe))
        self.target = None


def sample_matrix(family: str, width: int, heads: int, features: Tensor,
                  seed: int = 0) -> Tensor:
    """A matrix of the family on ``features``: M of a :class:`ProbeModel` at its
    random initialisation under ``seed``, (seqlen, seqlen) float64."""
    torch.manual_seed(seed)
    model = ProbeModel(family, width, heads, features).double()
    with torch.no_grad():
        return model()


# the basis in float32 (and the unit stencils it is built from), its float64
# copy and lstsq's float64 work copy
LINEAR_PART_BYTES = 24


def probe_memory_bytes(family: str, seqlen: int, width: int, heads: int) -> int:
    """An estimate of the memory one fit needs: the family's ``bytes_per_entry``
    for each matrix of each key (:meth:`Family.matrices`), plus the float64 target, its float32
    copy and the float64 evaluation; for a family with a ``linear_part``,
    :data:`LINEAR_PART_BYTES` for each of the least-squares basis's H + 9
    matrices (the heads' attention and LePE's 3 x 3 unit stencils). (Measured
    peak resident memory over the process baseline, one head at L = 1024,
    target included: softmax 94, linear 80, SSD 125 bytes per entry and
    matrix.)"""
    fam = check_family(family)
    count = fam.matrices(width, heads) * len(fam.keys)
    basis = LINEAR_PART_BYTES * (heads + 9) if fam.linear_part else 0
    return (fam.bytes_per_entry * count + basis + 32) * seqlen ** 2


# --------------------------------------------------------------------------- #
# Fitting
# --------------------------------------------------------------------------- #
# --------------------------------------------------------------------------- #
# Lower bounds and containment
# --------------------------------------------------------------------------- #
def family_floors(family: str, T: Tensor, width: int, heads: int) -> Dict[str, float]:
    """Certified lower bounds on the relative error of any M of the family
    (:mod:`.targets`): name -> floor. The family's best error lies
    in ``[max(floors), best fit]``.

    - 'rank': Eckart-Young at the family's rank bound (linear attention, MLLA);
    - 'row_sum': rows with one common sum (softmax and linear attention: each
      head's rows sum to 1; non-negative with one head);
    - 'causal+semiseparable': the causal SSD, zero above the diagonal and split
      blocks of rank <= H N below it (disjoint entries: the squares add);
    - 'semiseparable': the bidirectional SSD, split blocks of rank <= H N on
      both sides; MLLA with LePE, rank <= H w + W + 1 (W the grid's width: its
      stencil adds a (W + 1)-square corner to each split block);
    - 'trivial': 0, for a family with no other bound.
    """
    fam = check_family(family)
    T = T.double()
    L = T.shape[0]
    out = {}
    if fam.rank is not None:
        r = fam.rank(width, heads)
        out['rank'] = rank_floors(T, [r])[r]
    if family in ('softmax', 'linear'):
        out['row_sum'] = row_sum_floor(T, nonnegative=heads == 1)
    if family == 'ssd_causal':
        out['causal+semiseparable'] = math.hypot(
            causal_floor(T), semiseparable_floor(T, width * heads))
    if family == 'ssd_bidirectional':
        out['semiseparable'] = semiseparable_floor(T, width * heads, two_sided=True)
    if family == 'mlla_lepe':
        out['semiseparable'] = semiseparable_floor(
            T, width * heads + grid_shape(L)[1] + 1, two_sided=True)
    if not out:
        out['trivial'] = 0.0
    return out


# family -> the families that it contains at equal or smaller width and heads:
# every matrix of (contained, w', H') with w' <= w, H' <= H is one of (family,
# w, H) (extra channels and heads at zero weight; the bidirectional SSD with its
# backward direction off; MLLA with LePE with its kernels at zero). MLLA's RoPE
# frequencies depend on the width, so its widths are not nested.
CONTAINS: Dict[str, Tuple[Tuple[str, bool], ...]] = {
    'softmax': (('softmax', True), ),
    'linear': (('linear', True), ),
    'ssd_causal': (('ssd_causal', True), ),
    'ssd_bidirectional': (('ssd_bidirectional', True), ('ssd_causal', True)),
    'mlla': (),
    'mlla_lepe': (('mlla', False), ),
}


def contained_cells(family: str, width: int, heads: int,
                    cells: Sequence[Tuple[str, int, int]]) -> List[Tuple[str, int, int]]:
    """The (family, width, heads) of ``cells`` that (family, width, heads)
    contains (:data:`CONTAINS`), itself excluded."""
    out = []
    for other, w, h in cells:
        if (other, w, h) == (family, width, heads) or h > heads:
            continue
        for name, nested_widths in CONTAINS[family]:
            if other == name and (w <= width if nested_widths else w == width):
                out.append((other, w, h))
    return out


def nests(family: str, width: int, heads: int, inner: Tuple[str, int, int]) -> bool:
    """Whether :func:`nested_state` turns a fit of ``inner`` (family, width,
    heads) into parameters of (family, width, heads): the SSDs with one head,
    a causal or equal family at a width <= width."""
    other, w, h = inner
    return (family in ('ssd_causal', 'ssd_bidirectional') and heads == h == 1 and
            w <= width and (other == family or other == 'ssd_causal') and
            (other, w) != (family, width))


@torch.no_grad()
def nested_state(family: str, width: int, inner: Tuple[str, int, int],
                 state: Dict[str, Tensor], features: Tensor) -> Dict[str, Tensor]:
    """The parameters of (family, width, one head) whose M is that of the
    contained fit ``state`` of ``inner`` (:func:`nests`): the N' = w' state
    channels, the values and the gate copied into the first of N = w, the
    others' projections and convolutions at 0 (B = C = SiLU(0) = 0 there, and
    u's new channels 0); a causal fit in a bidirectional model has its
    backward convolution at 0 and D_b = 0 (M_b = 0) and twice the head
    weight (M = (M_f + M_b) / 2). The returned dict loads into a
    :class:`ProbeModel` (its features included)."""
    other, w0, _ = inner
    if not nests(family, width, 1, inner):
        raise ValueError(f'{other} at N = {w0} does not nest in {family} at N = {width}')
    model = ProbeModel(family, width, 1, features)
    out = model.state_dict()
    n0, n = w0, width
    i0, i = 2 * w0, 2 * width  # inner widths (expand 2)
    W0, W = state['mixer.in_proj.weight'], torch.zeros_like(out['mixer.in_proj.weight'])
    # in_proj rows [z, x, B, C, dt]; columns u
    for r0, r, size in ((0, 0, i0), (i0, i, i0), (2 * i0, 2 * i, n0),
                        (2 * i0 + n0, 2 * i + n, n0), (2 * i0 + 2 * n0, 2 * i + 2 * n, 1)):
        W[r:r + size, :w0] = W0[r0:r0 + size]
    out['mixer.in_proj.weight'] = W
    E = torch.zeros_like(out['embed.weight'])
    E[:w0] = state['embed.weight']
    out['embed.weight'] = E
    for direction in ('forward', 'backward'):
        names = _SSD_NAMES[direction]
        if f"mixer.{names['conv1d']}.weight" not in out:
            continue
        source = direction if f"mixer.{names['conv1d']}.weight" in state else None
        for part in ('weight', 'bias'):
            key = f"mixer.{names['conv1d']}.{part}"
            if key not in out:
                continue
            new = torch.zeros_like(out[key])
            if source is not None:  # conv channels [x, B, C]
                old = state[key]
                for r0, r, size in ((0, 0, i0), (i0, i, n0), (i0 + n0, i + n, n0)):
                    new[r:r + size] = old[r0:r0 + size]
            out[key] = new
        for name in ('dt_bias', 'A_log', 'D'):
            key = f'mixer.{names[name]}'
            if source is not None:
                out[key] = state[key].clone()
            elif name == 'D':
                out[key] = torch.zeros_like(out[key])
            else:  # the backward direction off: any step and decay
                out[key] = state[f"mixer.{_SSD_NAMES['forward'][name]}"].clone()
    both = 'mixer.conv1d_b.weight' in out
    out['head_weights'] = state['head_weights'] * (
        2.0 if both and 'mixer.conv1d_b.weight' not in state else 1.0)
    return out


# --------------------------------------------------------------------------- #
# Constructive starts
# --------------------------------------------------------------------------- #
def _embed_inputs(model: 'ProbeModel', u: Tensor) -> None:
    """Set the embedding P so that ``X P`` is closest to ``u`` (least squares;
    exact while the features have full row rank)."""
    X = model.features.double()
    P = torch.linalg.lstsq(X, u.double()).solution  # (feature_dim, d)
    model.embed.weight.copy_(P.T.to(model.embed.weight.dtype))


def _best_scale(M: Tensor, T: Tensor) -> float:
    den = float((M * M).sum())
    return float((M * T).sum()) / den if den > 0 else 0.0


def _softmax_candidates(T: Tensor, d: int):
    """(u, G) with ``u G u^T`` near ``log T`` up to a row constant, one pair per
    clip level and form (symmetric: the top-d eigenpairs of the symmetric part;
    asymmetric: ``[A, B]`` from a rank-d/2 SVD, G the shift)."""
    top = float(T.max())
    for eps in (1e-1, 1e-2, 1e-3, 1e-4):
        S = torch.log(T.clamp(min=eps * top))
        S = S - S.mean(1, keepdim=True)
        lam, V = torch.linalg.eigh((S + S.T) / 2)
        order = lam.abs().argsort(descending=True)[:d]
        yield V[:, order] * lam[order].abs().sqrt(), torch.diag(lam[order].sign())
        half = d // 2
        if half:
            U, sv, Vh = torch.linalg.svd(S)
            A = U[:, :half] * sv[:half].sqrt()
            B = Vh[:half].T * sv[:half].sqrt()
            G = torch.zeros(2 * half, 2 * half, dtype=S.dtype)
            G[:half, half:] = torch.eye(half, dtype=S.dtype)
            u = torch.cat([A, B], 1)
            if 2 * half < d:
                u = torch.cat([u, torch.zeros(len(u), d - 2 * half, dtype=u.dtype)], 1)
                G = torch.block_diag(G, torch.zeros(1, 1, dtype=G.dtype))
            yield u, G


@torch.no_grad()
def _softmax_start(model: 'ProbeModel', T: Tensor) -> None:
    """Softmax logits from the log of the target: ``softmax(u G u^T)`` with
    ``u G u^T`` the best of :func:`_softmax_candidates`, then ``q = u``,
    ``k = u G^T / s`` (s the logit scale) through the embedding and the qkv
    projection, and the head weight the least-squares scale."""
    from mmdinomamba.analysis.adapters import MMPretrainAttention
    mixer = model.mixer
    d = mixer.head_dims
    scale = MMPretrainAttention(mixer).logit_scale()
    best = None
    for u, G in _softmax_candidates(T, d):
        M = torch.softmax(u @ G @ u.T, dim=1)
        a = _best_scale(M, T)
        err = float((a * M - T).norm())
        if best is None or err < best[0]:
            best = (err, u, G, a)
    _, u, G, a = best
    _embed_inputs(model, u)
    W = mixer.qkv.weight
    W.zero_()
    W[:d] = torch.eye(d, dtype=W.dtype)
    W[d:2 * d] = (G / scale).to(W.dtype)
    if mixer.qkv.bias is not None:
        mixer.qkv.bias.zero_()
    model.head_weights.fill_(a)


def _nmf(T: Tensor, rank: int, iters: int = 300, symmetric: bool = False):
    """Non-negative factors of ``T >= 0`` by multiplicative updates from a fixed
    draw: (W, H), ``T ~ W H^T``, each (L, rank); symmetric: H = W."""
    g = torch.Generator().manual_seed(0)
    L = T.shape[0]
    mean = float(T.mean()) if float(T.mean()) > 0 else 1.0
    W = torch.rand(L, rank, generator=g, dtype=T.dtype) * (mean / rank) ** 0.5 + 1e-3
    H = W.clone() if symmetric else         torch.rand(L, rank, generator=g, dtype=T.dtype) * (mean / rank) ** 0.5 + 1e-3
    tiny = 1e-12
    for _ in range(iters):
        if symmetric:
            W = W * (0.5 + 0.5 * (T @ W) / (W @ (W.T @ W) + tiny))
            H = W
        else:
            W = W * (T @ H) / (W @ (H.T @ H) + tiny)
            H = H * (T.T @ W) / (H @ (W.T @ W) + tiny)
    return W, H


@torch.no_grad()
def _linear_start(model: 'ProbeModel', T: Tensor) -> None:
    """Linear attention from a non-negative factorisation of the target: with
    ``T+ ~ W H^T`` (W, H >= 0), ``phi(q) ~ W`` and ``phi(k) ~ H`` by ``q = log W``,
    ``k = log H`` (phi is the softmax over channels); a symmetric factorisation
    (rank d, q = k) or a general one (rank d / 2, the other channels held at
    -30 by the bias), whichever gives the closer M."""
    from mmdinomamba.ops.linear_attention import linear_attention_matrix
    mixer = model.mixer
    d = mixer.dim // mixer.num_heads
    Tp = T.clamp(min=0)
    candidates = []
    W, _ = _nmf(Tp, d, symmetric=True)
    lw = torch.log(W.clamp(min=1e-6 * float(W.max())))
    candidates.append((lw, lw, lw, None))
    half = d // 2
    if half:
        W, H = _nmf(Tp, half)
        lw = torch.log(W.clamp(min=1e-6 * float(W.max())))
        lh = torch.log(H.clamp(min=1e-6 * float(H.max())))
        pad = torch.full((len(T), d - half), -30.0, dtype=T.dtype)
        u = torch.cat([lw, lh, torch.zeros(len(T), d - 2 * half, dtype=T.dtype)], 1)
        candidates.append((torch.cat([lw, pad], 1), torch.cat([lh, pad], 1), u, half))
    best = None
    for q, k, u, h in candidates:
        M = linear_attention_matrix(q[None, None], k[None, None])[0, 0]
        a = _best_scale(M, T)
        err = float((a * M - T).norm())
        if best is None or err < best[0]:
            best = (err, u, h, a)
    _, u, half, a = best
    _embed_inputs(model, u)
    Wt = mixer.qkv.weight
    Wt.zero_()
    bias = mixer.qkv.bias
    if bias is not None:
        bias.zero_()
    if half is None:  # q = k = u
        Wt[:d] = torch.eye(d, dtype=Wt.dtype)
        Wt[d:2 * d] = torch.eye(d, dtype=Wt.dtype)
    else:  # q = [u_(:h), -30], k = [u_(h:2h), -30]
        Wt[:half, :half] = torch.eye(half, dtype=Wt.dtype)
        Wt[d:d + half, half:2 * half] = torch.eye(half, dtype=Wt.dtype)
        bias[half:d] = -30.0
        bias[d + half:2 * d] = -30.0
    model.head_weights.fill_(a)


# the SiLU's least value is at z = SILU_MIN_ARG; the SSD start writes no entry
# of B or C below SSD_START_MIN (a margin off the flat minimum)
SILU_MIN_ARG = -1.2784645
SSD_START_MIN = -0.2
SSD_ALS_ITERS = 100
# the largest decay per token the SSD start gives a direction
SSD_DECAY_MAX = 30.0
# the SSD's per-direction parameters (as SSDMixer names them)
_SSD_NAMES = {
    'forward': dict(conv1d='conv1d', dt_bias='dt_bias', A_log='A_log', D='D'),
    'backward': dict(conv1d='conv1d_b', dt_bias='dt_b_bias', A_log='A_log_b', D='D_b'),
}


def _silu_inverse(y: Tensor) -> Tensor:
    """z >= SILU_MIN_ARG with ``z sigmoid(z) = y`` (y above SiLU's least value),
    by bisection (float64)."""
    lo = torch.full_like(y, SILU_MIN_ARG)
    hi = y.clamp(min=0) + 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        below = mid * torch.sigmoid(mid) < y
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    return (lo + hi) / 2


def _masked_lstsq_rows(F: Tensor, E: Tensor, R: Tensor) -> Tensor:
    """Rows x_i minimising ``sum_j (E_ij F_j . x_i - R_ij)^2`` over E's support
    (a small ridge relative to the mean Gram trace: a row with few entries
    gets the least-norm answer): (L, rank)."""
    L, rank = R.shape[0], F.shape[1]
    G = ((E * E) @ (F[:, :, None] * F[:, None, :]).reshape(F.shape[0], -1)).view(
        L, rank, rank)
    ridge = 1e-10 * float(G.diagonal(dim1=1, dim2=2).sum(-1).mean()) + 1e-300
    rhs = (E * R) @ F
    eye = torch.eye(rank, dtype=R.dtype)
    return torch.linalg.solve(G + ridge * eye, rhs[..., None])[..., 0]


def _lag_decay(T: Tensor) -> float:
    """A decay per token for T's lower triangle: minus half the slope of the
    log mean square of its k-th subdiagonal against k (least squares over the
    lags 1 .. L / 2 with any energy), at least 0."""
    L = T.shape[0]
    lags, logs = [], []
    for k in range(1, max(L // 2, 2)):
        e = float(T.diagonal(-k).pow(2).mean()) if k < L else 0.0
        if e > 0:
            lags.append(k)
            logs.append(math.log(e))
    if len(lags) < 2:
        return 0.0
    x, y = torch.tensor(lags, dtype=torch.float64), torch.tensor(logs, dtype=torch.float64)
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / (x - x.mean()).pow(2).sum())
    return min(max(-slope / 2, 0.0), SSD_DECAY_MAX)


def _decay(L: int, lam: float, diagonal: bool, dtype=torch.float64) -> Tensor:
    """``exp(-lam (i - j))`` on and below the diagonal (strictly below unless
    ``diagonal``), 0 above: (L, L)."""
    i = torch.arange(L, dtype=dtype)
    lag = (i[:, None] - i[None, :]).clamp(min=0)
    return torch.exp(-lam * lag).tril(0 if diagonal else -1)


def _triangle_factors(T: Tensor, rank: int, lam: float, b: Optional[Tensor] = None,
                      diagonal: bool = False, iters: int = SSD_ALS_ITERS):
    """C, B (L, rank) with ``exp(-lam (i - j)) C_i . B_j`` closest to T_ij below
    the diagonal (on it too if ``diagonal``), by alternating least squares on
    those entries, C first, from ``B = b`` or else from the truncated SVD of
    the block ``T[L/2:, :L/2]`` with the decay undone (so that a T whose
    triangle is that of such a matrix of rank r is met after one sweep).
    The decay only conditions the problem (any lam gives the same products,
    ``C_i exp(-lam i)``, ``B_j exp(lam j)``: :func:`_gauge_decay`)."""
    L = T.shape[0]
    E = _decay(L, lam, diagonal, T.dtype)
    if b is None:
        m = L // 2
        i = torch.arange(L, dtype=T.dtype)
        undo = torch.exp((lam * (i[m:, None] - i[None, :m])).clamp(max=300.0))
        _, S, Vh = torch.linalg.svd(T[m:, :m] * undo)
        b = torch.zeros(L, rank, dtype=T.dtype)
        k = min(rank, len(S))
        b[:m, :k] = Vh[:k].T * S[:k].sqrt()
    for _ in range(iters):
        c = _masked_lstsq_rows(b, E, T)
        b = _masked_lstsq_rows(c, E.T, T.T)
    return c, b


def _ssd_residual(T: Tensor, factors, d: float) -> float:
    """``||tril(E o C B^T) + triu(E' o C' B'^T) + d I - T||_F`` (directions as
    :func:`_ssd_factors` returns them; the diagonal is the directions' sum)."""
    L = T.shape[0]
    M = d * torch.eye(L, dtype=T.dtype)
    for k, (c, b, lam) in enumerate(factors):
        part = _decay(L, lam, True, T.dtype) * (c @ b.T)
        M = M + (part.flip(0).flip(1) if k else part)
    return float((M - T).norm())


def _ssd_factors(T: Tensor, rank: int, two_sided: bool, rounds: int = 30):
    """The best of :func:`_ssd_factors_at` with each direction's conditioning
    decay at :func:`_lag_decay` of its triangle, at a quarter of it, or at 0
    (a decay too strong for T makes the least squares ill-conditioned)."""
    frames = [T] + ([T.flip(0).flip(1)] if two_sided else [])
    estimate = [_lag_decay(F) for F in frames]
    best = None
    for share in (1.0, 0.25, 0.0):
        factors, d = _ssd_factors_at(T, rank, [share * lam for lam in estimate], rounds)
        err = _ssd_residual(T, factors, d)
        if math.isfinite(err) and (best is None or err < best[0]):
            best = (err, factors, d)
        if share and not estimate[0] and not estimate[-1]:
            break  # no decay: the other shares are the same
    return best[1], best[2]


def _ssd_factors_at(T: Tensor, rank: int, lams: Sequence[float], rounds: int = 30):
    """The SSD's semiseparable generators of T:
    ``T ~ tril(E o C B^T) + triu(E' o C' B'^T) + d I`` (the second term only if
    two-sided: one lam per direction; E = ``exp(-lam (i - j))``),
    each of rank r. First each strict triangle alone
    (:func:`_triangle_factors`; the upper one as the lower triangle of T
    flipped, the backward scan's order), then ``rounds`` of refits that add
    the diagonal: ``d`` from the rows and columns that the triangles determine
    (r <= i < L - r), each direction's diagonal what T's leaves to it.
    Returns ([(C, B, lam) per direction, in its own order], d)."""
    L = T.shape[0]
    frames = [T] + ([T.flip(0).flip(1)] if len(lams) == 2 else [])
    factors = [_triangle_factors(F, rank, lam) for F, lam in zip(frames, lams)]

    def diagonals():  # each direction's C_i . B_i, in sequence order
        out = [(c * b).sum(1) for c, b in factors]
        return [out[0]] + [v.flip(0) for v in out[1:]]

    inner = slice(rank, L - rank) if L > 2 * rank else slice(0, L)
    d = float((T.diagonal() - sum(diagonals()))[inner].mean())
    for _ in range(rounds):
        for k, F in enumerate(frames):
            diag = diagonals()
            rest = T.diagonal() - d - sum(v for j, v in enumerate(diag) if j != k)
            F = F.clone()
            F.diagonal().copy_(rest.flip(0) if k else rest)
            factors[k] = _triangle_factors(F, rank, lams[k], factors[k][1],
                                           diagonal=True, iters=SSD_ALS_ITERS // 10)
        d = float((T.diagonal() - sum(diagonals())).mean())
    return [(c, b, lam) for (c, b), lam in zip(factors, lams)], d


def _gauge_decay(C: Tensor, B: Tensor, lam0: float):
    """The decay lam in [0, SSD_DECAY_MAX] per token that gives the products
    ``exp(-lam0 (i - j)) C_i . B_j`` their least spread factors: with
    ``C'_i = exp((lam - lam0) i) C_i``, ``B'_j = exp(-(lam - lam0) j) B_j``
    (the same products at decay lam), the least ``log ||C'||_F + log ||B'||_F``
    (convex in lam; golden section), C' and B' then scaled to equal norms.
    Returns (lam, C', B')."""
    L = C.shape[0]
    i = torch.arange(L, dtype=C.dtype)
    lc = torch.log(C.pow(2).sum(1).clamp(min=1e-300)) - 2 * lam0 * i
    lb = torch.log(B.pow(2).sum(1).clamp(min=1e-300)) + 2 * lam0 * i

    def spread(lam):
        return float(torch.logsumexp(2 * lam * i + lc, 0) +
                     torch.logsumexp(-2 * lam * i + lb, 0))

    lo, hi = 0.0, SSD_DECAY_MAX
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        x1, x2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if spread(x1) <= spread(x2):
            hi = x2
        else:
            lo = x1
    lam = (lo + hi) / 2
    # balance: log ||C'|| = log ||B'||, in log space (no overflow)
    shift = float(torch.logsumexp(2 * lam * i + lc, 0) -
                  torch.logsumexp(-2 * lam * i + lb, 0)) / 4
    C = C * torch.exp((lam - lam0) * i - shift)[:, None]
    B = B * torch.exp(-(lam - lam0) * i + shift)[:, None]
    return lam, C, B


def _silu_range(C: Tensor, B: Tensor):
    """C, B with each state channel's norms balanced and scaled so that no
    entry is below SSD_START_MIN, and the product of the two scales."""
    nc, nb = C.norm(dim=0), B.norm(dim=0)
    ok = (nc > 0) & (nb > 0)
    rho = torch.where(ok, (nb / nc.clamp(min=1e-300)).sqrt(), torch.ones_like(nc))
    C, B = C * rho, B / rho
    s_c = min(1.0, SSD_START_MIN / min(float(C.min()), -1e-300))
    s_b = min(1.0, SSD_START_MIN / min(float(B.min()), -1e-300))
    return s_c * C, s_b * B, s_c * s_b


@torch.no_grad()
def _ssd_start(model: 'ProbeModel', T: Tensor) -> None:
    """The SSD from its semiseparable blocks. With a constant step per
    direction (``dt``'s projection at 0, ``softplus(dt_bias) = delta``) and the
    convolutions passing each token through (last tap 1), the causal SSD's M
    is::

        M = a (E o (C B^T) delta + D I)    E_ij = exp(-lam (i - j)), i >= j; 0 above
                                           lam = delta exp(A_log), B = SiLU(u W_B)

    The start fits T's triangle strictly below the diagonal by ``c_i . b_j`` of
    rank r (:func:`_triangle_factors`), turns (c, b) into a decay and bounded
    factors (:func:`_gauge_decay`: ``exp(-lam (i - j)) C_i . B_j = c_i . b_j``),
    scales C and B into the SiLU's range and writes them through its inverse:
    u carries the pre-activations, ``W_B``, ``W_C`` pick them out, and the
    other state channels stay at SiLU(0) = 0. The head weight a undoes the
    scales; D meets T's mean diagonal. Causal: r = N / 2 (u is N wide: r
    channels of B and r of C). Bidirectional (M is the mean of the two
    directions): the backward direction fits the triangle above the
    diagonal on its own state channels, r = N / 4 each, each direction's
    convolution passing only its own channels (with N < 4 the forward one
    alone, r = N / 2, the backward convolution at 0). A family member of
    these ranks is met to round-off (within the features' span: L <=
    feature_dim; beyond, u is met in the least-squares sense and M is scaled
    by its least-squares factor, so the start is never worse than 0)."""
    mixer = model.mixer
    N, inner, L = mixer.d_state, mixer.d_inner, T.shape[0]
    directions = mixer.directions
    # both directions with N / 4 channels each, or (N < 4) the forward one alone
    fitted = directions if N // (2 * len(directions)) else directions[:1]
    rank = N // (2 * len(fitted))
    if rank == 0:
        return
    T = T.double()
    kappa = 1.0 / len(directions)  # M = a mean_d M_d
    W = mixer.in_proj.weight
    W.zero_()
    u = torch.zeros(L, N, dtype=T.dtype)
    a, delta_f = None, 1.0
    factors, _ = _ssd_factors(T, rank, len(fitted) == 2)
    for d, direction in enumerate(directions):
        names = _SSD_NAMES[direction]
        conv = getattr(mixer, names['conv1d'])
        conv.weight.zero_()  # a direction left off: B = C = SiLU(0) = 0
        if conv.bias is not None:
            conv.bias.zero_()
        getattr(mixer, names['D']).zero_()
        if d >= len(fitted):
            continue
        flip = direction == 'backward'
        lam, C, B = _gauge_decay(*factors[d])
        C, B, s = _silu_range(C, B)
        if flip:  # back to sequence order: the backward scan reads it flipped
            C, B = C.flip(0), B.flip(0)
        if a is None:
            a, delta = 1.0 / (kappa * s * delta_f), delta_f
        else:
            delta = 1.0 / (a * kappa * s)
        channels = slice(d * rank, (d + 1) * rank)
        cols_b = slice(2 * d * rank, (2 * d + 1) * rank)
        cols_c = slice((2 * d + 1) * rank, (2 * d + 2) * rank)
        u[:, cols_b], u[:, cols_c] = _silu_inverse(B), _silu_inverse(C)
        eye = torch.eye(rank, dtype=W.dtype)
        W[2 * inner:2 * inner + N][channels, cols_b] = eye
        W[2 * inner + N:2 * inner + 2 * N][channels, cols_c] = eye
        conv.weight[:inner, :, -1] = 1.0
        for offset in (inner, inner + N):  # conv channels [x, B, C]
            conv.weight[offset:offset + N][channels, :, -1] = 1.0
        getattr(mixer, names['dt_bias']).fill_(math.log(math.expm1(delta)))
        getattr(mixer, names['A_log']).fill_(math.log(max(lam, 1e-9) / delta))
    _embed_inputs(model, u)
    model.head_weights.fill_(a)
    M0 = model().detach().double()
    D = float((T.diagonal() - M0.diagonal()).mean()) / a
    for direction in directions:
        getattr(mixer, _SSD_NAMES[direction]['D']).fill_(D)
    # the least-squares scale of the whole M: never worse than the zero matrix
    # (with L > feature_dim the inputs are met only in the least-squares sense)
    M = model().detach().double()
    if torch.isfinite(M).all():
        model.head_weights.mul_(_best_scale(M, T))


# family -> constructive start ``(model, T) -> None`` (one head)
STARTS: Dict[str, Callable] = {'softmax': _softmax_start, 'linear': _linear_start,
                               'ssd_causal': _ssd_start, 'ssd_bidirectional': _ssd_start}


@dataclass
class FitResult:
    """What :func:`fit_matrix` found.

    Attributes:
        family (str), width (int), heads (int), seqlen (int): the cell.
        starts (list[str]): each start's name ('constructive', 'contained', 'warm',
            'seed <s>').
        errors (list[float]): relative error of each start after the base
            budget, float64; never above its initial error (a start that the
            optimiser leaves worse keeps its initialisation).
        initial_errors (list[float]): the same at each start's initialisation.
        best (float): the best error found (after the convergence rounds);
            inf if no start gave a finite matrix.
        best_start (str): the start that gave it.
        best_block (float, optional): its relative error on the block strictly
            below the diagonal (None unless :func:`has_offdiag_block`).
        rounds (list[float]): the best error after each convergence round
            (the budget doubling each round).
        evaluations (int): forward and backward passes spent, all starts and
            rounds.
        converged (bool): whether the last round gained less than ``tol``
            (False: it stopped at ``max_steps``).
        floors (dict): :func:`family_floors` of the target.
        floor (float, optional): the rank floor (None for a family without
            one); block_floor: the same for the off-diagonal block.
        rank (int, optional), block_rank (int, optional): the bounds used.
        seconds (float): wall time.
        matrix (Tensor, optional): the best M (float64), if asked for.
        state (dict): the best parameters (the model's state without the
            features), for a warm start.
    """
    family: str
    width: int
    heads: int
    seqlen: int
    starts: List[str] = field(default_factory=list)
    errors: List[float] = field(default_factory=list)
    initial_errors: List[float] = field(default_factory=list)
    best: float = math.inf
    best_start: Optional[str] = None
    best_block: Optional[float] = None
    rounds: List[float] = field(default_factory=list)
    evaluations: int = 0
    converged: bool = False
    floors: Dict[str, float] = field(default_factory=dict)
    floor: Optional[float] = None
    block_floor: Optional[float] = None
    rank: Optional[int] = None
    block_rank: Optional[int] = None
    seconds: float = 0.0
    matrix: Optional[Tensor] = None
    state: Optional[Dict[str, Tensor]] = None

    @property
    def lower_bound(self) -> float:
        """The largest certified floor."""
        return max(self.floors.values()) if self.floors else 0.0

    @property
    def reported(self) -> Optional[float]:
        """The best error, or None ("no fit") if it is above 1: the zero matrix
        (every family's, at zero head weight) has error 1, so a fit above it is
        the optimiser's failure, not a value of the family."""
        return self.best if self.best <= 1.0 else None


BLOCK_MIN_SHARE = 0.01


def has_offdiag_block(T: Tensor) -> bool:
    """Whether the block strictly below the diagonal holds at least
    :data:`BLOCK_MIN_SHARE` of T's energy (``||block||_F^2 / ||T||_F^2``): below
    that (bands, fast decays), its relative error measures a few small entries."""
    return bool(offdiag_block(T).pow(2).sum() >= BLOCK_MIN_SHARE * T.pow(2).sum())


def _relative_error(M: Tensor, T: Tensor) -> float:
    return float((M - T).norm() / T.norm())


def check_fit_args(family: str, seqlen: int, width: int, heads: int, steps: int,
                   restarts: int, memory_limit_gb: float) -> Family:
    """Validate a fit's settings (a ValueError names the first problem); the
    family's row."""
    fam = check_family(family)
    for name, value in (('seqlen', seqlen), ('width', width), ('heads', heads),
                        ('steps', steps), ('restarts', restarts)):
        _check_size(name, value)
    if not (isinstance(memory_limit_gb, (int, float)) and memory_limit_gb > 0):
        raise ValueError(f'memory_limit_gb must be a positive number, got '
                         f'{memory_limit_gb!r}')
    need = probe_memory_bytes(family, seqlen, width, heads)
    if need > memory_limit_gb * 2 ** 30:
        raise ValueError(
            f'{family} with {heads} head(s) at L = {seqlen} needs about '
            f'{need / 2 ** 30:.1f} GiB, over the limit of {memory_limit_gb:g} GiB: '
            'use a shorter sequence or fewer heads, or raise the memory limit')
    return fam


ADAM_LR = 0.03
ADAM_SHARE = 0.25
LBFGS_HISTORY = 50
SCALE_RANGE = (1e-3, 1e3)
MIN_GAIN = 0.01


def _adam_phase(model: nn.Module, loss_of: Callable[[Tensor], Tensor],
                steps: int) -> Dict[str, Tensor]:
    """``steps`` Adam steps, the learning rate falling from :data:`ADAM_LR` to 0
    along a cosine; ``model`` is left at the best parameters the phase saw.
    Returns the per-parameter scale ``1 / sqrt(v)`` from Adam's second moments,
    divided by its median and clipped to :data:`SCALE_RANGE`."""
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    adam = torch.optim.Adam(named.values(), lr=ADAM_LR)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(adam, steps)
    best_loss, best_state = math.inf, None
    for _ in range(steps):
        adam.zero_grad(set_to_none=True)
        loss = loss_of(model())
        if not torch.isfinite(loss):
            break
        if loss.item() < best_loss:
            best_loss, best_state = loss.item(), copy.deepcopy(model.state_dict())
        loss.backward()
        adam.step()
        schedule.step()
    with torch.no_grad():
        last = loss_of(model()).item()
    if best_state is not None and not last <= best_loss:
        model.load_state_dict(best_state)
    scale = {name: adam.state[p]['exp_avg_sq'].sqrt().add(1e-12).reciprocal()
             if p in adam.state else torch.ones_like(p)
             for name, p in named.items()}
    median = torch.cat([t.detach().flatten() for t in scale.values()]).median()
    return {name: (t / median).clamp(*SCALE_RANGE).detach()
            for name, t in scale.items()}


def _lbfgs_phase(model: nn.Module, loss_of: Callable[[Tensor], Tensor],
                 scale: Dict[str, Tensor], budget: int) -> int:
    """L-BFGS in the scaled coordinates ``p = p0 + scale * z`` for at most
    ``budget`` evaluations; writes the result into ``model``; returns the
    evaluations used."""
    from torch.func import functional_call
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    base = {name: p.detach().clone() for name, p in named.items()}
    z = {name: torch.zeros_like(p, requires_grad=True) for name, p in named.items()}
    lbfgs = torch.optim.LBFGS(list(z.values()), lr=1, max_iter=budget,
                              max_eval=budget, history_size=LBFGS_HISTORY,
                              tolerance_grad=0, tolerance_change=0,
                              line_search_fn='strong_wolfe')
    evaluations = 0

    def params():
        return {name: base[name] + scale[name] * z[name] for name in z}

    def closure():
        nonlocal evaluations
        lbfgs.zero_grad(set_to_none=True)
        loss = loss_of(functional_call(model, params(), ()))
        evaluations += 1
        if torch.isfinite(loss):
            loss.backward()
        return loss

    try:
        lbfgs.step(closure)
    except RuntimeError:
        # a line search that overflows (a step too large for float32) ends the
        # phase where it began: the model keeps its parameters
        return evaluations
    with torch.no_grad():
        for name, value in params().items():
            if not torch.isfinite(value).all():
                return evaluations
        for name, value in params().items():
            named[name].copy_(value)
    return evaluations


def _minimise(model: nn.Module, loss_of: Callable[[Tensor], Tensor],
              steps: int) -> int:
    """Alternate Adam and preconditioned L-BFGS phases for at most ``steps``
    evaluations (module docstring); leave ``model`` at the best parameters
    seen. Returns the evaluations spent."""
    used = 0
    best_loss, best_state = math.inf, None
    while used < steps:
        adam_steps = min(max(1, math.ceil(ADAM_SHARE * steps)), steps - used)
        scale = _adam_phase(model, loss_of, adam_steps)
        used += adam_steps
        if used < steps:
            used += _lbfgs_phase(model, loss_of, scale, steps - used)
        with torch.no_grad():
            loss = float(loss_of(model()))
        if not loss < best_loss * (1 - MIN_GAIN):
            if loss < best_loss:
                best_loss, best_state = loss, copy.deepcopy(model.state_dict())
            break  # a stalled round: L-BFGS has converged (or diverged)
        best_loss, best_state = loss, copy.deepcopy(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    return used


CONVERGENCE_TOL = 1e-3
MAX_STEPS_FACTOR = 16


def _evaluate(model: 'ProbeModel', T64: Tensor) -> Tuple[float, Tensor]:
    """(relative error in float64, M in float64 on the CPU); inf if M is not
    finite."""
    with torch.no_grad():
        M = copy.deepcopy(model).double()().cpu()
    error = _relative_error(M, T64) if torch.isfinite(M).all() else math.inf
    return error, M


def fit_matrix(target: Tensor, family: str, width: int, heads: int = 1,
               steps: int = 400, restarts: int = 1, seed: int = 0,
               memory_limit_gb: float = 8.0, keep_matrix: bool = False,
               floors: Optional[Dict[str, Dict[int, float]]] = None,
               features: Optional[Tensor] = None, feature_dim: int = 64,
               warm_start: Optional[Dict[str, Tensor]] = None,
               contained_start: Optional[Dict[str, Tensor]] = None,
               device='cpu', constructive: bool = True,
               tol: float = CONVERGENCE_TOL, max_steps: Optional[int] = None,
               bounds: Optional[Dict[str, float]] = None) -> FitResult:
    """Fit a family's M to ``target`` until the best fit stops improving.

    The starts: the family's constructive start (:data:`STARTS`, one head),
    ``warm_start`` if given, and ``restarts`` random draws (seeds
    ``seed + r``); each runs ``steps`` evaluations. The best start then
    continues in rounds of twice the last round's budget (``2 steps``,
    ``4 steps``, ...) until a round improves its error by less than ``tol``
    (converged) or the next round would take the evaluations past
    ``max_steps`` (not converged). Every argument is checked before any work
    starts; seeds are fixed, so a rerun gives the same fit.

    Args:
        target (Tensor): T, (seqlen, seqlen).
        family (str): a key of :data:`FAMILIES`.
        width (int): D_QK or N.
        heads (int): H. Defaults to 1.
        steps (int): evaluations (forward and backward passes) of each start,
            and the first round's half. Defaults to 400.
        restarts (int): random initialisations, seeds ``seed + r``
            (r = 0 .. restarts - 1). Defaults to 1.
        seed (int): Defaults to 0.
        memory_limit_gb (float): refuse a fit whose estimated memory
            (:func:`probe_memory_bytes`) is larger. Defaults to 8.
        keep_matrix (bool): keep the best M. Defaults to False.
        floors (dict, optional): ``{'whole': {r: floor}, 'block': {r: floor}}``
            rank floors already computed for T; None to compute them here.
        features (Tensor, optional): X, (seqlen, feature_dim); None for
            :func:`token_features` (seqlen, ``feature_dim``, ``seed``).
        feature_dim (int): width of the default features. Defaults to 64.
        contained_start (dict, optional): parameters of this family from the
            best fit of a family it contains (:func:`nested_state`), for one
            more start ('contained').
        warm_start (dict, optional): parameters (a :attr:`FitResult.state`,
            e.g. the fit of the same family and width to a shorter sequence:
            none of them depends on L) for one more start.
        device (str | torch.device): where the fit runs (the target, errors,
            floors and the returned state stay on the CPU). Defaults to 'cpu'.
        constructive (bool): use the family's constructive start. Defaults to
            True.
        tol (float): the convergence rule's least gain. Defaults to 1e-3.
        max_steps (int, optional): the most evaluations of the fit; None for
            :data:`MAX_STEPS_FACTOR` x ``steps`` x the number of starts.
        bounds (dict, optional): :func:`family_floors` already computed.

    Returns:
        FitResult.
    """
    check_target(target)
    seqlen = target.shape[0]
    fam = check_fit_args(family, seqlen, width, heads, steps, restarts,
                         memory_limit_gb)
    device = check_device(device)
    if not (isinstance(tol, (int, float)) and tol > 0):
        raise ValueError(f'tol must be a positive number, got {tol!r}')
    if features is None:
        features = token_features(seqlen, feature_dim, seed)
    elif features.dim() != 2 or features.shape[0] != seqlen:
        raise ValueError(f'features must have shape ({seqlen}, feature_dim) for a '
                         f'{seqlen} x {seqlen} target, got {tuple(features.shape)}')
    rank = fam.rank(width, heads) if fam.rank else None
    block_rank = fam.block_rank(width, heads) if fam.block_rank else None
    T64 = target.detach().double().cpu()
    T_block = offdiag_block(T64)
    has_block = has_offdiag_block(T64)
    if floors is None:
        floors = dict(whole=rank_floors(T64, [rank]) if rank is not None else {},
                      block=rank_floors(T_block, [block_rank])
                      if block_rank is not None and has_block else {})
    result = FitResult(family, width, heads, seqlen, rank=rank, block_rank=block_rank,
                       floor=floors['whole'].get(rank),
                       block_floor=floors['block'].get(block_rank),
                       floors=dict(bounds) if bounds is not None else
                       family_floors(family, T64, width, heads))
    starts = []
    if constructive and family in STARTS and heads == 1:
        starts.append('constructive')
    if contained_start is not None:
        starts.append('contained')
    if warm_start is not None:
        starts.append('warm')
    starts += [f'seed {seed + r}' for r in range(restarts)]
    if max_steps is None:
        max_steps = MAX_STEPS_FACTOR * steps * len(starts)
    T32 = T64.float().to(device)
    scale = T32.pow(2).sum()

    def loss_of(M):
        return (M - T32).pow(2).sum() / scale

    start_time = time.perf_counter()
    best_model, best_error = None, math.inf
    for name in starts:
        torch.manual_seed(int(name[5:]) if name.startswith('seed ') else seed)
        model = ProbeModel(family, width, heads, features)
        if name == 'constructive':
            STARTS[family](model, T64)
        elif name == 'warm':
            model.load_state_dict(dict(warm_start, features=model.features))
        elif name == 'contained':
            model.load_state_dict(dict(contained_start, features=model.features))
        model = model.to(device)
        M = model()
        if not M.requires_grad:
            raise RuntimeError(
                f'{type(model.mixer).__name__}.mixing_matrices returned a matrix '
                'without gradient: the mixing-matrix protocol must follow the '
                "caller's grad mode (remove its torch.no_grad)")
        result.starts.append(name)
        result.initial_errors.append(_relative_error(M.detach().double().cpu(), T64)
                                     if torch.isfinite(M).all() else math.inf)
        initial = copy.deepcopy(model.state_dict())
        if fam.linear_part:
            model.project(T32)
        result.evaluations += _minimise(model, loss_of, steps)
        if fam.linear_part:
            model.set_linear_part()
        error, _ = _evaluate(model, T64)
        if not error <= result.initial_errors[-1]:  # never worse than the start
            model.load_state_dict(initial)
            error, _ = _evaluate(model, T64)
        result.errors.append(error)
        if best_model is None or error < best_error:
            best_model, best_error, result.best_start = model, error, name
    # the convergence rule: the best start goes on, its budget doubling, until a
    # round gains less than tol
    budget = steps
    while math.isfinite(best_error):
        budget *= 2
        if result.evaluations + budget > max_steps:
            break
        before = copy.deepcopy(best_model.state_dict())
        if fam.linear_part:
            best_model.project(T32)
        result.evaluations += _minimise(best_model, loss_of, budget)
        if fam.linear_part:
            best_model.set_linear_part()
        error, _ = _evaluate(best_model, T64)
        if not error <= best_error:  # a worse round is undone
            best_model.load_state_dict(before)
        gain = best_error - error
        best_error = min(best_error, error)
        result.rounds.append(best_error)
        if gain < tol:
            result.converged = True
            break
    if best_model is not None and math.isfinite(best_error):
        error, M = _evaluate(best_model, T64)
        result.best = error
        result.best_block = (_relative_error(offdiag_block(M), T_block)
                             if has_block else None)
        result.state = {name: value.detach().cpu()
                        for name, value in best_model.state_dict().items()
                        if name != 'features'}
        result.matrix = M if keep_matrix else None
    result.seconds = time.perf_counter() - start_time
    return result
