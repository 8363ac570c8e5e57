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
mask. Three ways to compute ``y``, all with mamba-ssm's argument layout:

* :func:`ssd_ref`         - the recurrence, one token at a time (slow twin, ground truth);
* :func:`ssd_chunked`     - the chunked SSD algorithm (CPU/GPU default);
* :func:`ssd_quadratic`   - ``M x`` with ``M`` materialised by :func:`ssd_mixing_matrix`.

:func:`ssd` is the public entry point: it validates inputs and dispatches to a
backend (``'auto'``, ``'chunked'``, ``'quadratic'``, ``'ref'``, ``'triton'`` or
``'mamba_ssm'``). ``'triton'`` is the fused chunk scan of
:mod:`mmdinomamba.ops.triton` (CUDA only, no ``initial_states`` /
``return_final_states``; float16, bfloat16 and float32: ``'auto'`` scans float64
with ``'chunked'``); its chunk is its own tile size, so ``chunk_size`` only
matters to the PyTorch backends (it changes rounding, not the result).

Input checks. :func:`check_ssd_inputs` rejects a non-finite ``dt`` through
:func:`check_finite`, which the mixers and backbones also call on their inputs.
That test reads a value back from the device, so on CUDA it runs only when the
environment variable ``MMDINOMAMBA_CHECK_FINITE=1`` is set (on the CPU it always
runs).
"""
import math
import os
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from mmengine.logging import print_log

from .fused import TRITON_DTYPES

BACKENDS = ('auto', 'chunked', 'quadratic', 'ref', 'triton', 'mamba_ssm')

Tensor = torch.Tensor
SSDOutput = Union[Tensor, Tuple[Tensor, Tensor]]


# --------------------------------------------------------------------------- #
# Input handling shared by every backend
# --------------------------------------------------------------------------- #
def _shape_error(name: str, expected: str, got: Tensor) -> ValueError:
    return ValueError(f'ssd: `{name}` must have shape {expected}, '
                      f'got {tuple(got.shape)}')


def check_ssd_inputs(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                     D: Optional[Tensor] = None, z: Optional[Tensor] = None,
                     dt_bias: Optional[Tensor] = None,
                     initial_states: Optional[Tensor] = None,
                     chunk_size: int = 256) -> None:
    """Raise a ValueError naming the first argument with a wrong shape.

    Also rejects a non-finite ``dt`` (it would silently poison the scan): always
    for CPU tensors, and for CUDA tensors only with ``MMDINOMAMBA_CHECK_FINITE=1``
    (the check synchronises the device).
    """
    if x.dim() != 4:
        raise _shape_error('x', '(batch, seqlen, nheads, headdim)', x)
    batch, seqlen, nheads, headdim = x.shape
    if dt.shape != (batch, seqlen, nheads):
        raise _shape_error('dt', f'(batch, seqlen, nheads) = '
                           f'{(batch, seqlen, nheads)}', dt)
    if A.shape != (nheads, ):
        raise _shape_error('A', f'(nheads,) = {(nheads, )}', A)
    if B.dim() != 4 or B.shape[:2] != (batch, seqlen):
        raise _shape_error('B', f'(batch, seqlen, ngroups, dstate) with '
                           f'batch, seqlen = {(batch, seqlen)}', B)
    ngroups, dstate = B.shape[2:]
    if nheads % ngroups != 0:
        raise ValueError(f'ssd: ngroups ({ngroups}, from `B`) must divide '
                         f'nheads ({nheads}, from `x`)')
    if C.shape != B.shape:
        raise _shape_error('C', f'the shape of B = {tuple(B.shape)}', C)
    if D is not None and D.shape not in ((nheads, ), (nheads, headdim)):
        raise _shape_error('D', f'(nheads,) or (nheads, headdim) = '
                           f'{(nheads, )} or {(nheads, headdim)}', D)
    if z is not None and z.shape != x.shape:
        raise _shape_error('z', f'the shape of x = {tuple(x.shape)}', z)
    if dt_bias is not None and dt_bias.shape != (nheads, ):
        raise _shape_error('dt_bias', f'(nheads,) = {(nheads, )}', dt_bias)
    if (initial_states is not None
            and initial_states.shape != (batch, nheads, headdim, dstate)):
        raise _shape_error(
            'initial_states', '(batch, nheads, headdim, dstate) = '
            f'{(batch, nheads, headdim, dstate)}', initial_states)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f'ssd: `chunk_size` must be a positive int, '
                         f'got {chunk_size!r}')
    check_finite(dt, 'ssd: `dt`')


def _check_finite(t: Tensor) -> bool:
    """Whether to run the (device-synchronising) finiteness check on ``t``."""
    return t.device.type != 'cuda' or os.environ.get('MMDINOMAMBA_CHECK_FINITE') == '1'


def check_finite(t: Tensor, what: str) -> None:
    """Raise a ValueError ``'<what> contains NaN or Inf values'`` if ``t`` has any.

    Runs always for CPU tensors and, because it reads a value back from the
    device (a host synchronisation), for CUDA tensors only with
    ``MMDINOMAMBA_CHECK_FINITE=1``; never while ``torch.compile`` traces.

    Args:
        t (Tensor): any shape.
        what (str): names the tensor in the message, e.g. ``'SSDMixer: input'``.
    """
    if torch.compiler.is_compiling() or not _check_finite(t):
        return
    finite = torch.isfinite(t)
    if not finite.all():
        bad = finite.numel() - int(finite.sum())
        raise ValueError(f'{what} contains NaN or Inf values ({bad} of '
                         f'{finite.numel()})')


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
    dt = dt.float() if dt.dtype not in (torch.float32, torch.float64) else dt
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


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------- #
# The slow twin: the recurrence, token by token
# --------------------------------------------------------------------------- #
def ssd_ref(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
            chunk_size: int = 256, D: Optional[Tensor] = None,
            z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
            dt_softplus: bool = False, initial_states: Optional[Tensor] = None,
            return_final_states: bool = False) -> SSDOutput:
    """SSD as the plain recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``.

    Deliberately naive: one Python step per token. Same signature as :func:`ssd`
    (``chunk_size`` is accepted and ignored). Used as the reference in tests.

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
    cdtype = _compute_dtype(x)
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
                chunk_size: int = 256, D: Optional[Tensor] = None,
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
    cdtype = _compute_dtype(x)
    batch, seqlen, nheads, headdim = x.shape
    dt = discretize_dt(dt, dt_bias, dt_softplus).to(cdtype)
    xc = x.to(cdtype)
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
    cdtype = _compute_dtype(B)
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
                  chunk_size: int = 256, D: Optional[Tensor] = None,
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


# --------------------------------------------------------------------------- #
# Optional fused backend and dispatch
# --------------------------------------------------------------------------- #
def _mamba_ssm_scan():
    """mamba-ssm's fused Triton scan, or None when it cannot be imported."""
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception:  # ImportError, or its CUDA extensions failing to load
        return None
    return mamba_chunk_scan_combined


def mamba_ssm_available() -> bool:
    return _mamba_ssm_scan() is not None


_LOGGED = set()


def resolve_backend(backend: str, device: torch.device, needs_states: bool = False,
                    dtype: Optional[torch.dtype] = None) -> str:
    """Turn ``'auto'`` into a concrete backend for tensors on ``device``.

    ``'auto'`` picks ``'triton'`` on CUDA when Triton imports (unless
    ``needs_states``: initial or final states are asked for), else ``'mamba_ssm'``
    on CUDA when mamba-ssm imports, otherwise ``'chunked'``; where it would pick
    ``'triton'`` for a ``dtype`` the kernels do not take (float64), ``'chunked'``.
    The choice is logged once per (request, device type).
    """
    from .fused import triton_available
    if backend not in BACKENDS:
        raise ValueError(f'ssd: unknown backend {backend!r}; '
                         f'choose one of {BACKENDS}')
    cuda = device.type == 'cuda'
    chosen = backend
    if backend == 'auto':
        if cuda and triton_available() and not needs_states:
            chosen = 'triton' if dtype is None or dtype in TRITON_DTYPES else 'chunked'
        elif cuda and mamba_ssm_available():
            chosen = 'mamba_ssm'
        else:
            chosen = 'chunked'
    if chosen == 'triton' and needs_states:
        raise ValueError('ssd: backend "triton" has no `initial_states` / '
                         '`return_final_states`; use "chunked", "ref" or "mamba_ssm"')
    if chosen == 'mamba_ssm' and not (cuda and mamba_ssm_available()):
        raise ValueError('ssd: backend "mamba_ssm" needs CUDA tensors and an '
                         'importable mamba-ssm (pip install mmdinomamba[mamba])')
    if chosen == 'triton' and not (cuda and triton_available()):
        raise ValueError('ssd: backend "triton" needs CUDA tensors and an '
                         'importable Triton')
    key = (backend, device.type, chosen)
    if key not in _LOGGED and not torch.compiler.is_compiling():  # no graph break
        _LOGGED.add(key)
        print_log(f'SSD backend: requested {backend!r} on {device.type}, '
                  f'using {chosen!r}', logger='current')
    return chosen


def ssd(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
        chunk_size: int = 256, D: Optional[Tensor] = None,
        z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
        dt_softplus: bool = False, initial_states: Optional[Tensor] = None,
        return_final_states: bool = False, backend: str = 'auto') -> SSDOutput:
    """Mamba-2 SSD scan with mamba-ssm's ``mamba_chunk_scan_combined`` layout.

    Args:
        x (Tensor): (batch, seqlen, nheads, headdim).
        dt (Tensor): (batch, seqlen, nheads).
        A (Tensor): (nheads,).
        B (Tensor): (batch, seqlen, ngroups, dstate).
        C (Tensor): (batch, seqlen, ngroups, dstate).
        chunk_size (int): tokens per chunk of the PyTorch backends. Defaults to 256.
        D (Tensor, optional): (nheads,) or (nheads, headdim).
        z (Tensor, optional): (batch, seqlen, nheads, headdim); output * silu(z).
        dt_bias (Tensor, optional): (nheads,).
        dt_softplus (bool): ``dt = softplus(dt + dt_bias)``. Defaults to False.
        initial_states (Tensor, optional): (batch, nheads, headdim, dstate).
        return_final_states (bool): also return the final state.
        backend (str): one of :data:`BACKENDS`. Defaults to ``'auto'``.

    Returns:
        Tensor: (batch, seqlen, nheads, headdim) in x's dtype; with
        ``return_final_states`` also (batch, nheads, headdim, dstate).
    """
    check_ssd_inputs(x, dt, A, B, C, D, z, dt_bias, initial_states, chunk_size)
    needs_states = initial_states is not None or return_final_states
    chosen = resolve_backend(backend, x.device, needs_states, x.dtype)
    if chosen == 'triton':
        from .triton import ssd_triton
        return ssd_triton(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                          dt_softplus=dt_softplus)
    kwargs = dict(chunk_size=chunk_size, D=D, z=z, dt_bias=dt_bias,
                  dt_softplus=dt_softplus, initial_states=initial_states,
                  return_final_states=return_final_states)
    if chosen == 'mamba_ssm':
        return _mamba_ssm_scan()(x, dt, A, B, C, **kwargs)
    fn = {'chunked': ssd_chunked, 'quadratic': ssd_quadratic, 'ref': ssd_ref}[chosen]
    return fn(x, dt, A, B, C, **kwargs)
