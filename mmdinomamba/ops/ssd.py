"""Mamba-2 state space duality (SSD), in plain PyTorch.

Notation. Tensors are described with words; the paper's letters name the SSM
matrices only:

=============  ==========================================  ============
word           meaning                                     paper
=============  ==========================================  ============
batch          images in the batch
seqlen         tokens in the sequence                      L (length)
nheads         SSM heads                                   H
headdim        channels per head                           P
ngroups        heads sharing one B and C (divides nheads)  G
dstate         state size                                  N
chunk          tokens per chunk in the chunked scan        Q (or c)
=============  ==========================================  ============

The recurrence, per head, with a scalar decay ``A < 0`` (Mamba-2) and a
data-dependent step ``dt_t > 0``::

    h_t = exp(dt_t * A) * h_{t-1} + dt_t * x_t B_t^T         (state, headdim x dstate)
    y_t = h_t C_t + D * x_t                                  (output, headdim)

Unrolled, ``y = M x`` over the token axis, with the token-mixing matrix::

    M_ij = exp(cs_i - cs_j) * (C_i . B_j) * dt_j   for i >= j,   0 otherwise
    cs_i = sum_{k <= i} dt_k * A                              (cumulative log-decay)

plus ``D`` on the diagonal. ``L_ij = exp(cs_i - cs_j)`` is the learnable causal
mask. Three ways to compute ``y``, all with mamba-ssm's argument layout and one signature:

* :func:`ssd_ref`         - the recurrence, one token at a time (slow twin, ground truth);
* :func:`ssd_chunked`     - the chunked SSD algorithm (CPU/GPU default);
* :func:`ssd_quadratic`   - ``M x`` with ``M`` materialised by :func:`ssd_mixing_matrix`.

This module is the math alone. :func:`mmdinomamba.ops.backend.ssd_scan` is the
public entry point: it checks the inputs and picks one of these, or the fused
kernels of :mod:`mmdinomamba.ops.triton`, or mamba-ssm's (its ``backend``).
"""
import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from einops import rearrange, repeat

from .spec import CHUNK_SIZE, at_least_float32, float32_or_wider, resolve_chunk_size

Tensor = torch.Tensor
SSDOutput = Union[Tensor, Tuple[Tensor, Tensor]]


# --------------------------------------------------------------------------- #
# Pieces shared by the three
# --------------------------------------------------------------------------- #
def discretize_dt(dt: Tensor, dt_bias: Optional[Tensor] = None,
                  dt_softplus: bool = False) -> Tensor:
    """The step actually used by the scan: ``softplus(dt + dt_bias)`` in fp32.

    Args:
        dt (Tensor): (batch, seqlen, nheads).
        dt_bias (Tensor, optional): (nheads,).
        dt_softplus (bool): apply softplus. Defaults to False.

    Returns:
        Tensor: (batch, seqlen, nheads), float32 or float64. The cumulative sum
        of ``dt * A`` over long sequences needs at least fp32.
    """
    dt = at_least_float32(dt)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    return dt


def _skip_and_gate(y: Tensor, x: Tensor, D: Optional[Tensor],
                   z: Optional[Tensor]) -> Tensor:
    """``(y + D * x) * silu(z)``, each term optional; all (batch, seqlen, nheads, headdim)."""
    if D is not None:
        y = y + x * (D if D.dim() == 2 else D[:, None]).to(y.dtype)
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y


def _heads_from_groups(BC: Tensor, nheads: int) -> Tensor:
    """(batch, seqlen, ngroups, dstate) -> (batch, seqlen, nheads, dstate)."""
    return repeat(BC, 'b l g n -> b l (g r) n', r=nheads // BC.shape[2])


# --------------------------------------------------------------------------- #
# The slow twin: the recurrence, token by token
# --------------------------------------------------------------------------- #
def ssd_ref(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
            chunk_size: Union[int, str] = CHUNK_SIZE, D: Optional[Tensor] = None,
            z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
            dt_softplus: bool = False, initial_states: Optional[Tensor] = None,
            return_final_states: bool = False) -> SSDOutput:
    """SSD as the plain recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``.

    Deliberately naive: one Python step per token. Same signature as
    :func:`ssd_chunked` (``chunk_size`` is accepted and ignored). Used as the
    reference in tests.

    Args:
        x (Tensor): (batch, seqlen, nheads, headdim).
        dt (Tensor): (batch, seqlen, nheads).
        A (Tensor): (nheads,), negative for a decaying state.
        B (Tensor): (batch, seqlen, ngroups, dstate).
        C (Tensor): (batch, seqlen, ngroups, dstate).
        chunk_size (int): ignored.
        D (Tensor, optional): (nheads,) or (nheads, headdim) skip.
        z (Tensor, optional): (batch, seqlen, nheads, headdim) gate, ``y * silu(z)``.
        dt_bias (Tensor, optional): (nheads,).
        dt_softplus (bool): ``dt = softplus(dt + dt_bias)``.
        initial_states (Tensor, optional): (batch, nheads, headdim, dstate).
        return_final_states (bool): also return the last state.

    Returns:
        Tensor: y (batch, seqlen, nheads, headdim) in x's dtype, and if
        ``return_final_states`` the state (batch, nheads, headdim, dstate).
    """
    cdtype = float32_or_wider(x.dtype)
    batch, seqlen, nheads, headdim = x.shape
    dt = discretize_dt(dt, dt_bias, dt_softplus).to(cdtype)
    B = _heads_from_groups(B, nheads).to(cdtype)
    C = _heads_from_groups(C, nheads).to(cdtype)
    xc = x.to(cdtype)
    A = A.to(cdtype)
    h = (initial_states.to(cdtype) if initial_states is not None else
         x.new_zeros(batch, nheads, headdim, B.shape[-1], dtype=cdtype))
    ys = []
    for t in range(seqlen):
        decay = torch.exp(dt[:, t] * A)  # (batch, nheads)
        h = (decay[:, :, None, None] * h +
             dt[:, t, :, None, None] * xc[:, t, :, :, None] * B[:, t, :, None, :])
        ys.append(torch.einsum('bhpn,bhn->bhp', h, C[:, t]))
    y = torch.stack(ys, dim=1) if ys else xc.new_zeros(xc.shape)
    y = _skip_and_gate(y, xc, D, z).to(x.dtype)
    return (y, h) if return_final_states else y


# --------------------------------------------------------------------------- #
# The chunked SSD algorithm
# --------------------------------------------------------------------------- #
def segsum(a: Tensor) -> Tensor:
    """Segment sums of the last axis: ``out[..., i, j] = sum_{k=j+1..i} a[..., k]``.

    Entries with ``i < j`` are ``-inf`` so that ``exp(segsum(a))`` is the causal
    decay mask ``L``. Each entry is a direct sum over its own segment (a masked
    cumulative sum), not a difference of two prefix sums, so it stays exact when
    the prefix sums are large.

    Args:
        a (Tensor): (..., T).

    Returns:
        Tensor: (..., T, T).
    """
    T = a.shape[-1]
    strictly_lower = torch.ones(T, T, dtype=torch.bool, device=a.device).tril(-1)
    # column j of `terms` holds a[k] for k > j: its cumsum down the rows is sum_{j<k<=i}
    terms = a[..., :, None].expand(*a.shape, T).masked_fill(~strictly_lower, 0)
    out = terms.cumsum(dim=-2)
    return out.masked_fill(~strictly_lower.logical_or(
        torch.eye(T, dtype=torch.bool, device=a.device)), -math.inf)


def ssd_chunked(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                chunk_size: Union[int, str] = CHUNK_SIZE, D: Optional[Tensor] = None,
                z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                dt_softplus: bool = False,
                initial_states: Optional[Tensor] = None,
                return_final_states: bool = False) -> SSDOutput:
    """The chunked SSD algorithm of Mamba-2, any sequence length.

    The sequence is cut into chunks of ``chunk_size`` tokens (the last one padded
    with ``dt = 0`` tokens, which neither decay nor write the state). Then, with
    ``X = x * dt``, ``cs`` the within-chunk cumulative ``dt * A`` and
    ``L = exp(segsum(dt * A))`` the within-chunk decay mask:

    1. intra-chunk outputs (diagonal blocks of M): ``Y_diag = (L o C B^T) X``;
    2. each chunk's final state from its own inputs: ``S_c = sum_s L[end, s] X_s B_s^T``;
    3. inter-chunk recurrence: ``H_c = exp(sum dt A over chunk c-1) H_{c-1} + S_{c-1}``;
    4. state to output (off-diagonal blocks): ``Y_off_i = exp(cs_i) H_c C_i``.

    Overflow. Every log-decay is a direct sum over its own segment (``segsum``,
    the prefix sums ``cs``), never a difference of two cumulative sums: where
    ``dt * A`` summed over a chunk leaves float32's range, the sums are ``-inf``
    and the decays 0 (as in the recurrence), not ``-inf - (-inf) = NaN``; and
    one huge-``dt`` token does not cost the later tokens their precision.

    Same signature and shapes as :func:`ssd_ref`. Computes in fp32 (fp64 for
    fp64 inputs) and returns x's dtype.
    """
    cdtype = float32_or_wider(x.dtype)
    batch, seqlen, nheads, headdim = x.shape
    dt = discretize_dt(dt, dt_bias, dt_softplus).to(cdtype)
    xc = x.to(cdtype)
    chunk_size = resolve_chunk_size(chunk_size, seqlen)
    chunk_size = min(chunk_size, max(seqlen, 1))  # same result, no padding waste
    pad = (-seqlen) % chunk_size
    Xdt = F.pad(xc * dt[..., None], (0, 0, 0, 0, 0, pad))
    Bh = F.pad(_heads_from_groups(B, nheads).to(cdtype), (0, 0, 0, 0, 0, pad))
    Ch = F.pad(_heads_from_groups(C, nheads).to(cdtype), (0, 0, 0, 0, 0, pad))
    dA = F.pad(dt * A.to(cdtype), (0, 0, 0, pad))

    Xdt, Bh, Ch = (rearrange(t, 'b (c q) h d -> b c q h d', q=chunk_size)
                   for t in (Xdt, Bh, Ch))
    dA = rearrange(dA, 'b (c q) h -> b h c q', q=chunk_size)
    cs = dA.cumsum(dim=-1)  # (batch, nheads, chunks, chunk)

    # 1. intra-chunk: Y_diag[l] = sum_{s <= l} L[l, s] (C_l . B_s) X_s
    L = torch.exp(segsum(dA))
    Y_diag = torch.einsum('bclhn,bcshn,bhcls,bcshp->bclhp', Ch, Bh, L, Xdt)
    # 2. chunk states: S_c = sum_s L[end, s] X_s B_s^T  (L's last row: exp(sum_{k>s} dt_k A))
    decay_to_end = L[..., -1, :]
    S = torch.einsum('bcshn,bhcs,bcshp->bchpn', Bh, decay_to_end, Xdt)
    # 3. inter-chunk recurrence over chunk boundaries (a tiny SSD over chunks)
    H0 = (initial_states.to(cdtype)[:, None] if initial_states is not None else
          torch.zeros_like(S[:, :1]))
    S = torch.cat([H0, S], dim=1)  # (batch, chunks + 1, nheads, headdim, dstate)
    chunk_decay = torch.exp(segsum(F.pad(cs[..., -1], (1, 0))))
    H = torch.einsum('bhzc,bchpn->bzhpn', chunk_decay, S)
    H_in, H_final = H[:, :-1], H[:, -1]
    # 4. state to output: Y_off[l] = exp(cs_l) H_in C_l
    Y_off = torch.einsum('bclhn,bchpn,bhcl->bclhp', Ch, H_in, torch.exp(cs))

    y = rearrange(Y_diag + Y_off, 'b c q h p -> b (c q) h p')[:, :seqlen]
    y = _skip_and_gate(y, xc, D, z).to(x.dtype)
    return (y, H_final) if return_final_states else y


# --------------------------------------------------------------------------- #
# The token-mixing matrix and the quadratic form
# --------------------------------------------------------------------------- #
def ssd_decay_mask(dt: Tensor, A: Tensor, dt_bias: Optional[Tensor] = None,
                   dt_softplus: bool = False) -> Tensor:
    """The learnable causal mask ``L`` of :func:`ssd_mixing_matrix`, per head.

    ``L_ij = exp(sum_{k=j+1..i} dt_k A)`` for ``i >= j`` (1 on the diagonal),
    0 for ``i < j``. On any block strictly below the diagonal it factors as
    ``exp(cs_i) exp(-cs_j)``, so such a block has rank 1.

    Args:
        dt (Tensor): (batch, seqlen, nheads).
        A (Tensor): (nheads,).
        dt_bias (Tensor, optional): (nheads,).
        dt_softplus (bool): ``dt = softplus(dt + dt_bias)``.

    Returns:
        Tensor: L, (batch, nheads, seqlen, seqlen), fp32 (fp64 for fp64 dt).
    """
    dt = discretize_dt(dt, dt_bias, dt_softplus)
    return torch.exp(segsum(rearrange(dt * A.to(dt.dtype), 'b l h -> b h l')))


def ssd_mixing_matrix(dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                      D: Optional[Tensor] = None,
                      dt_bias: Optional[Tensor] = None,
                      dt_softplus: bool = False) -> Tensor:
    """Materialise ``M`` with ``y = M x`` (per head, per channel of the head).

    ``M_ij = exp(cs_i - cs_j) (C_i . B_j) dt_j`` for ``i >= j``, plus ``D`` on the
    diagonal when ``D`` is per head. The step ``dt_j`` is folded into ``M`` so
    that it acts on the raw input ``x``.

    Args:
        dt (Tensor): (batch, seqlen, nheads).
        A (Tensor): (nheads,).
        B, C (Tensor): (batch, seqlen, ngroups, dstate).
        D (Tensor, optional): (nheads,). A per-channel D (nheads, headdim) is not
            a per-head matrix; pass it to :func:`ssd_quadratic` instead.
        dt_bias (Tensor, optional): (nheads,).
        dt_softplus (bool): ``dt = softplus(dt + dt_bias)``.

    Returns:
        Tensor: M, (batch, nheads, seqlen, seqlen), fp32 (fp64 for fp64 B).
    """
    cdtype = float32_or_wider(B.dtype)
    nheads = dt.shape[-1]
    dt = discretize_dt(dt, dt_bias, dt_softplus).to(cdtype)
    Bh = _heads_from_groups(B, nheads).to(cdtype)
    Ch = _heads_from_groups(C, nheads).to(cdtype)
    L = ssd_decay_mask(dt, A)
    M = L * torch.einsum('bihn,bjhn->bhij', Ch, Bh) * rearrange(dt, 'b j h -> b h 1 j')
    if D is not None:
        if D.dim() != 1:
            raise ValueError('ssd_mixing_matrix: `D` must have shape (nheads,); '
                             f'got {tuple(D.shape)}')
        M = M + torch.diag_embed(D.to(cdtype)[:, None].expand(nheads, M.shape[-1]))
    return M


def ssd_quadratic(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                  chunk_size: Union[int, str] = CHUNK_SIZE, D: Optional[Tensor] = None,
                  z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                  dt_softplus: bool = False,
                  initial_states: Optional[Tensor] = None,
                  return_final_states: bool = False) -> SSDOutput:
    """``y = M x`` with ``M`` from :func:`ssd_mixing_matrix` (O(seqlen^2) memory).

    Same signature as :func:`ssd_ref`; ``initial_states`` and
    ``return_final_states`` are not supported (use :func:`ssd_chunked`).
    """
    if initial_states is not None or return_final_states:
        raise ValueError('ssd_quadratic: `initial_states` and '
                         '`return_final_states` need the chunked or ref backend')
    M = ssd_mixing_matrix(dt, A, B, C, dt_bias=dt_bias, dt_softplus=dt_softplus)
    xc = x.to(M.dtype)
    y = torch.einsum('bhij,bjhp->bihp', M, xc)
    return _skip_and_gate(y, xc, D, z).to(x.dtype)
