"""MLLA's linear attention and its forget-gate variants, in plain PyTorch.

Notation. Tensors are described with words; the letters name the attention's
matrices:

=============  ============================================  ==========
word           meaning                                       letter
=============  ============================================  ==========
batch          images in the batch
seqlen         tokens, on an (H, W) grid in raster order     N
nheads         attention heads
headdim        query / key channels per head                 d
vdim           value channels per head                       e
width          nheads * headdim: Q's and K's channels        C
chunk          tokens per chunk of the causal computation    c
=============  ============================================  ==========

MLLA's attention, per head, for the projections ``q, k`` (seqlen, d) and the
values ``V`` (seqlen, e), one equation a step::

    1. Q = ELU(q) + 1 ,  K = ELU(k) + 1                  feature map, every entry > 0
    2. Q_r = RoPE(Q) ,  K_r = RoPE(K)                     2-D rotation of channel pairs
    3. kbar = (1 / N) sum_j K_j                           the normaliser's mean key
    4. S = (1 / N) sum_j K_r,j^T V_j                      (d, e)
    5. z_i = 1 / (Q_i . kbar + eps)
    6. y_i = z_i Q_r,i S

(``normalize=False``: ``y_i = Q_r,i S``.) By associativity steps 4-6 are
``y = A V`` with the mixing matrix ``A_ij = (Q_r,i . K_r,j) / (N (Q_i . kbar +
eps))``: :func:`mlla_attention_ref` computes that, the slow twin.

With a forget gate the attention is causal in raster order and recurrent. The
gate is a log-decay per token ``l_t <= 0``, one scalar per head (Mamba-2's form)
or one per key channel (gated linear attention), taken as it is (no step ``dt``
to divide by, no floor)::

    7. S_t = diag(exp(l_t)) S_(t-1) + K_r,t^T V_t          (d, e)
    8. Z_t = exp(l_t) (.) Z_(t-1) + K_t                    (d)
    9. y_t = Q_r,t S_t / (Q_t . Z_t + N eps)   (normalize=False: Q_r,t S_t / N)

Unrolled, ``y_t = sum_(j<=t) sum_d Q_r,td K_r,jd exp(cs_td - cs_jd) V_j / ...``
with ``cs_t = sum_(s<=t) l_s`` (per channel, or the head's scalar for every
channel). :func:`gated_linear_attention` computes it in chunks of ``c`` tokens
(every exponent it takes is <= 0); :func:`gated_linear_attention_ref` runs the
recurrence one token at a time (the slow twin) and :func:`gla_mixing_matrix`
forms the causal mixing matrix.

Layout: everything here is per head, ``(batch, nheads, seqlen, channels)``;
:func:`mlla_features` turns the projection ``[q | k]`` (batch, seqlen, 2 C) into
that layout in the cast it needs anyway. The computation runs in float32 (float64
for float64 input), under autocast too.
"""
import functools
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .backend import use_triton
from .spec import TRITON_DTYPES, float32_or_wider

Tensor = torch.Tensor
HeadTable = Tuple[Tensor, Tensor]

ATTENTION_BACKENDS = ('auto', 'ref')
CHUNK_HEAD = 64  # tokens per chunk with a scalar decay per head
CHUNK_CHANNEL = 16  # with a decay per channel: the chunk's decays are (c, c, d)


# --------------------------------------------------------------------------- #
# Steps 1-2: the feature map and the rotation
# --------------------------------------------------------------------------- #
def rope_head_table(cos: Tensor, sin: Tensor, nheads: int) -> HeadTable:
    """A 2-D RoPE table (:func:`mmdinomamba.models.mixers.positional.rope_2d_table`:
    ``cos, sin`` (seqlen, C / 2), one angle per channel pair) laid out per head
    and channel, so that the rotation is two products and a sum::

        x_r = x (.) cos2 + swap(x) (.) sin2
        cos2[2m] = cos2[2m + 1] = cos_m ,  sin2[2m] = -sin_m ,  sin2[2m + 1] = sin_m

    with ``swap`` exchanging the channels of each pair.

    Returns:
        tuple: (cos2, sin2), each (nheads, seqlen, headdim) in the table's dtype.
    """
    seqlen, pairs = cos.shape
    if (2 * pairs) % nheads or (2 * pairs // nheads) % 2:
        raise ValueError(f'rope_head_table: {2 * pairs} channels do not split into '
                         f'{nheads} heads of channel pairs')
    cos2 = cos.repeat_interleave(2, dim=-1)
    sin2 = torch.stack([-sin, sin], dim=-1).flatten(-2)
    return tuple(t.view(seqlen, nheads, -1).transpose(0, 1).contiguous()
                 for t in (cos2, sin2))


def _contiguous_as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype``, contiguous, in one pass (a cast writes the layout; a
    tensor already in ``dtype`` is copied)."""
    return t.to(dtype, memory_format=torch.contiguous_format) if t.dtype != dtype \
        else t.contiguous()


def _swap_pairs(x: Tensor) -> Tensor:
    return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)


def mlla_features(qk: Tensor, nheads: int,
                  table: Optional[HeadTable] = None) -> Tuple[Tensor, Tensor]:
    """Steps 1-2: ``[Q, K]`` and ``[Q_r, K_r]`` per head from the projection.

    Args:
        qk (Tensor): (batch, seqlen, 2 C), ``[q | k]``, any float dtype.
        nheads (int): heads; divides C.
        table (tuple, optional): :func:`rope_head_table` of the grid, in the
            compute dtype; None: no rotation (``[Q_r, K_r]`` is ``[Q, K]``).

    Returns:
        tuple: feat, rot, each (2, batch, nheads, seqlen, headdim) in float32
        (float64 for float64 input), contiguous; index 0 is Q, 1 is K.
    """
    batch, seqlen, two_c = qk.shape
    dtype = float32_or_wider(qk.dtype)
    heads = qk.view(batch, seqlen, 2, nheads, two_c // (2 * nheads))
    # the cast writes the per-head layout: one pass for both
    feat = F.elu(_contiguous_as(heads.permute(2, 0, 3, 1, 4), dtype)) + 1.0
    if table is None:
        return feat, feat
    cos2, sin2 = table
    return feat, feat * cos2 + _swap_pairs(feat) * sin2


def mlla_features_ref(qk: Tensor, nheads: int, rotate=None) -> Tuple[Tensor, Tensor]:
    """The twin of :func:`mlla_features`: ELU + 1 on the projection, ``rotate``
    (None: none; else a function of (batch, seqlen, C) tensors, e.g.
    :func:`~mmdinomamba.models.mixers.positional.rope_2d` on the grid) on Q and K
    each, then the head split."""
    dtype = float32_or_wider(qk.dtype)
    feat = (F.elu(qk.to(dtype)) + 1.0).chunk(2, dim=-1)
    rot = feat if rotate is None else tuple(rotate(t) for t in feat)

    def per_head(t):
        return t.unflatten(-1, (nheads, -1)).transpose(1, 2)

    return (torch.stack([per_head(t) for t in feat]),
            torch.stack([per_head(t.to(dtype)) for t in rot]))


def values_per_head(v: Tensor, nheads: int) -> Tensor:
    """(batch, seqlen, nheads * vdim) -> (batch, nheads, seqlen, vdim) in the
    compute dtype, contiguous (one pass: the cast writes the layout)."""
    batch, seqlen, width = v.shape
    return _contiguous_as(v.view(batch, seqlen, nheads, width // nheads).transpose(1, 2),
                          float32_or_wider(v.dtype))


# --------------------------------------------------------------------------- #
# Steps 3-6: the attention over all tokens
# --------------------------------------------------------------------------- #
def mlla_attention_parts(q: Tensor, k: Tensor, q_r: Tensor, k_r: Tensor, v: Tensor,
                         normalize: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """Steps 3-6 in O(seqlen d e), left as the numerator and the normaliser that
    :func:`mlla_output` divides: ``N = Q_r (K_r^T V)`` and ``r_i = Q_i . sum_j K_j``
    (``y = N / (r + seqlen eps)``, :func:`mlla_attention`); None without
    ``normalize`` (``y = N / seqlen``).

    Args:
        q, k, q_r, k_r (Tensor): (batch, nheads, seqlen, d), Q and K before and
            after the rotation.
        v (Tensor): (batch, nheads, seqlen, e).
        normalize (bool): Defaults to True.

    Returns:
        tuple: N (batch, nheads, seqlen, e), r (batch, nheads, seqlen, 1) or None.
    """
    num = q_r @ (k_r.transpose(-1, -2) @ v)
    if not normalize:
        return num, None
    return num, q @ k.sum(dim=2, keepdim=True).transpose(-1, -2)


def mlla_attention(q: Tensor, k: Tensor, q_r: Tensor, k_r: Tensor, v: Tensor,
                   eps: float = 1e-6, normalize: bool = True) -> Tensor:
    """Steps 3-6 in O(seqlen d e): ``y = z (.) Q_r (K_r^T V / N)``
    (:func:`mlla_attention_parts`, divided).

    Args:
        q, k, q_r, k_r (Tensor): (batch, nheads, seqlen, d).
        v (Tensor): (batch, nheads, seqlen, e).
        eps (float): the normaliser's floor. Defaults to 1e-6.
        normalize (bool): divide by ``Q_i . kbar + eps``. Defaults to True.

    Returns:
        Tensor: (batch, nheads, seqlen, e).
    """
    num, den = mlla_attention_parts(q, k, q_r, k_r, v, normalize)
    c = output_constant(q.shape[2], eps, normalize)
    return num / c if den is None else num / (den + c)


def output_constant(seqlen: int, eps: float, normalize: bool) -> float:
    """The ``c`` of ``y = N / (r + c)``: ``seqlen eps``, or ``seqlen`` (with
    ``r = 0``) without the normaliser."""
    return seqlen * eps if normalize else float(seqlen)


def mlla_attention_ref(q: Tensor, k: Tensor, q_r: Tensor, k_r: Tensor, v: Tensor,
                       eps: float = 1e-6, normalize: bool = True) -> Tensor:
    """The slow twin of :func:`mlla_attention`: ``y = A V`` with the mixing matrix
    :func:`mlla_mixing_matrix` formed, O(seqlen^2)."""
    return mlla_mixing_matrix(q, k, q_r, k_r, eps, normalize) @ v


def mlla_mixing_matrix(q: Tensor, k: Tensor, q_r: Tensor, k_r: Tensor,
                       eps: float = 1e-6, normalize: bool = True) -> Tensor:
    """``A_ij = (Q_r,i . K_r,j) / (N (Q_i . kbar + eps))`` (or ``/ N``):
    (batch, nheads, seqlen, seqlen)."""
    n = q.shape[2]
    w = q_r @ k_r.transpose(-1, -2)
    if not normalize:
        return w / n
    kbar = k.mean(dim=2)
    z = 1.0 / (torch.einsum('bhnd,bhd->bhn', q, kbar) + eps)
    return w * z[..., None] / n


# --------------------------------------------------------------------------- #
# Steps 7-9: the forget gate
# --------------------------------------------------------------------------- #
def _check_log_decay(q: Tensor, log_decay: Tensor) -> None:
    batch, nheads, seqlen, d = q.shape
    if log_decay.shape[:3] != (batch, nheads, seqlen) or \
            log_decay.shape[-1] not in (1, d):
        raise ValueError(f'gated linear attention: log_decay must be (batch, nheads, '
                         f'seqlen, 1) (a scalar per head) or (..., {d}) (per channel) '
                         f'for q {tuple(q.shape)}, got {tuple(log_decay.shape)}')


@functools.lru_cache(maxsize=None)
def _tril(size: int, diagonal: int, device: torch.device) -> Tensor:
    return torch.ones(size, size, dtype=torch.bool, device=device).tril(diagonal)


def _decays(cs_rows: Tensor, cs_cols: Tensor, diagonal: int) -> Tensor:
    """``exp(cs_i - cs_j)`` where ``j <= i + diagonal``, else 0:
    (..., rows, cols, channels) from (..., rows, channels) and (..., cols, channels)."""
    diff = cs_rows[..., :, None, :] - cs_cols[..., None, :, :]
    keep = _tril(diff.shape[-3], diagonal, diff.device)[..., None]
    return diff.masked_fill(~keep, float('-inf')).exp()


def _gla_chunked(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor,
                 chunk: int) -> Tensor:
    """``y_t = sum_(j<=t) sum_d q_td k_jd exp(cs_td - cs_jd) v_j``, chunk by chunk:
    within a chunk the decays are formed (every exponent <= 0), across chunks the
    chunks' end states decay from chunk to chunk (the same form one level up)."""
    batch, nheads, seqlen, d = q.shape
    pad = -seqlen % chunk
    q, k, v, log_decay = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, log_decay))
    q, k, v, log_decay = (t.unflatten(2, (-1, chunk)) for t in (q, k, v, log_decay))
    cs = log_decay.cumsum(dim=3)  # (batch, nheads, chunks, chunk, 1 or d)
    # (a) within each chunk
    inner = _decays(cs, cs, 0)  # (..., chunk, chunk, 1 or d)
    if inner.shape[-1] == 1:
        scores = (q @ k.transpose(-1, -2)) * inner[..., 0]
    else:  # row i: Q_i against the keys decayed to token i, (chunk, d) each
        decayed = k[..., None, :, :] * inner  # (..., i, j, d)
        scores = (q[..., :, None, :] @ decayed.transpose(-1, -2))[..., 0, :]
    y = scores @ v
    # (b) each chunk's contribution to the state at its end: (..., chunks, d, e)
    last = cs[..., -1:, :]
    ends = (k * (last - cs).exp()).transpose(-1, -2) @ v
    # (c) the state entering chunk m: sum over p < m of exp(C_(m-1) - C_p) ends_p
    totals = cs[..., -1, :].cumsum(dim=2)  # C_m, (batch, nheads, chunks, 1 or d)
    across = _decays(totals - last[..., 0, :], totals, -1)  # (..., m, p, 1 or d)
    if across.shape[-1] == 1:
        entering = torch.einsum('bhmp,bhpde->bhmde', across[..., 0], ends)
    else:
        entering = torch.einsum('bhmpd,bhpde->bhmde', across, ends)
    y = y + (q * cs.exp()) @ entering
    return y.flatten(2, 3)[:, :, :seqlen]


def gated_linear_attention_parts(q: Tensor, k: Tensor, q_r: Tensor, k_r: Tensor,
                                 v: Tensor, log_decay: Tensor, normalize: bool = True,
                                 chunk_size: Optional[int] = None
                                 ) -> Tuple[Tensor, Optional[Tensor]]:
    """Steps 7-9 in chunks, left as the numerator ``N_t = Q_r,t S_t`` and the raw
    normaliser ``r_t = Q_t . Z_t`` (None without ``normalize``) that
    :func:`mlla_output` divides; arguments as :func:`gated_linear_attention`."""
    _check_log_decay(q, log_decay)
    chunk = chunk_size or (CHUNK_HEAD if log_decay.shape[-1] == 1 else CHUNK_CHANNEL)
    chunk = min(chunk, q.shape[2])
    num = _gla_chunked(q_r, k_r, v, log_decay, chunk)
    if not normalize:
        return num, None
    return num, _gla_chunked(q, k, torch.ones_like(v[..., :1]), log_decay, chunk)


def gated_linear_attention(q: Tensor, k: Tensor, q_r: Tensor, k_r: Tensor, v: Tensor,
                           log_decay: Tensor, eps: float = 1e-6, normalize: bool = True,
                           chunk_size: Optional[int] = None) -> Tensor:
    """Steps 7-9 (causal linear attention with a forget gate), in chunks.

    Args:
        q, k, q_r, k_r (Tensor): (batch, nheads, seqlen, d).
        v (Tensor): (batch, nheads, seqlen, e).
        log_decay (Tensor): (batch, nheads, seqlen, 1) for a scalar per head, or
            (batch, nheads, seqlen, d) for one per key channel; <= 0.
        eps (float): Defaults to 1e-6.
        normalize (bool): Defaults to True.
        chunk_size (int, optional): tokens per chunk; None: 64 for a scalar per
            head, 16 per channel (its decays within a chunk take chunk^2 d). It
            changes the rounding only.

    Returns:
        Tensor: (batch, nheads, seqlen, e).
    """
    num, den = gated_linear_attention_parts(q, k, q_r, k_r, v, log_decay, normalize,
                                            chunk_size)
    c = output_constant(q.shape[2], eps, normalize)
    return num / c if den is None else num / (den + c)


def gated_linear_attention_ref(q: Tensor, k: Tensor, q_r: Tensor, k_r: Tensor,
                               v: Tensor, log_decay: Tensor, eps: float = 1e-6,
                               normalize: bool = True,
                               chunk_size: Optional[int] = None) -> Tensor:
    """The slow twin of :func:`gated_linear_attention`: the recurrence (steps 7-9),
    one token at a time (``chunk_size`` is ignored)."""
    _check_log_decay(q, log_decay)
    batch, nheads, n, d = q.shape
    S = q.new_zeros(batch, nheads, d, v.shape[-1])
    Z = q.new_zeros(batch, nheads, d)
    ys = []
    for t in range(n):
        a = log_decay[:, :, t].exp()  # (batch, nheads, 1 or d)
        S = a[..., None] * S + k_r[:, :, t, :, None] * v[:, :, t, None, :]
        Z = a * Z + k[:, :, t]
        num = torch.einsum('bhd,bhde->bhe', q_r[:, :, t], S)
        if normalize:
            ys.append(num / ((q[:, :, t] * Z).sum(-1, keepdim=True) + n * eps))
        else:
            ys.append(num / n)
    return torch.stack(ys, dim=2)


def gla_mixing_matrix(q: Tensor, k: Tensor, q_r: Tensor, k_r: Tensor,
                      log_decay: Tensor, eps: float = 1e-6,
                      normalize: bool = True) -> Tensor:
    """The causal mixing matrix of :func:`gated_linear_attention`, (batch, nheads,
    seqlen, seqlen): ``A_ij = sum_d Q_r,id K_r,jd exp(cs_id - cs_jd) / den_i`` for
    ``j <= i``, with ``den_i = sum_(j<=i) sum_d Q_id K_jd exp(cs_id - cs_jd) + N eps``
    (or ``N``)."""
    _check_log_decay(q, log_decay)
    n = q.shape[2]
    L = _decays(log_decay.cumsum(2), log_decay.cumsum(2), 0)  # (b, h, n, n, 1 or d)
    w = (q_r[..., :, None, :] * k_r[..., None, :, :] * L).sum(-1)
    if not normalize:
        return w / n
    den = (q[..., :, None, :] * k[..., None, :, :] * L).sum(-1).sum(-1, keepdim=True)
    return w / (den + n * eps)


def linear_attention_parts(q: Tensor, k: Tensor, q_r: Tensor, k_r: Tensor, v: Tensor,
                           log_decay: Optional[Tensor] = None, eps: float = 1e-6,
                           normalize: bool = True, backend: str = 'auto'
                           ) -> Tuple[Tensor, Optional[Tensor], float]:
    """MLLA's attention term per head as ``(N, r, c)``, ``y = N / (r + c)``
    (:func:`mlla_output` divides): :func:`mlla_attention_parts` without a forget
    gate, :func:`gated_linear_attention_parts` with one (``log_decay``).
    ``backend='ref'`` takes the slow twins (:func:`mlla_attention_ref`,
    :func:`gated_linear_attention_ref`), which divide themselves (``r`` None,
    ``c = 1``).

    Returns:
        tuple: N (batch, nheads, seqlen, e), r (batch, nheads, seqlen, 1) or None,
        and the constant c.
    """
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f'linear attention: unknown backend {backend!r}; choose one '
                         f'of {ATTENTION_BACKENDS}')
    if backend == 'ref':
        if log_decay is None:
            return mlla_attention_ref(q, k, q_r, k_r, v, eps, normalize), None, 1.0
        return gated_linear_attention_ref(q, k, q_r, k_r, v, log_decay, eps,
                                          normalize), None, 1.0
    if log_decay is None:
        num, den = mlla_attention_parts(q, k, q_r, k_r, v, normalize)
    else:
        num, den = gated_linear_attention_parts(q, k, q_r, k_r, v, log_decay, normalize)
    return num, den, output_constant(q.shape[2], eps, normalize)


def linear_attention_heads(q: Tensor, k: Tensor, q_r: Tensor, k_r: Tensor, v: Tensor,
                           log_decay: Optional[Tensor] = None, eps: float = 1e-6,
                           normalize: bool = True, backend: str = 'auto') -> Tensor:
    """:func:`linear_attention_parts`, divided: (batch, nheads, seqlen, e)."""
    num, den, c = linear_attention_parts(q, k, q_r, k_r, v, log_decay, eps, normalize,
                                         backend)
    return num / c if den is None else num / (den + c)


# --------------------------------------------------------------------------- #
# The output: tokens-major, with LePE (and the shortcut) added
# --------------------------------------------------------------------------- #
def mlla_output_ref(num: Tensor, den: Optional[Tensor], extra: Optional[Tensor],
                    const: float, dtype: torch.dtype) -> Tensor:
    """``out = P + N / (r + c)`` (``r = 0`` when None), tokens-major, in ``dtype``.

    Args:
        num (Tensor): (batch, nheads, seqlen, e), the numerator N.
        den (Tensor, optional): (batch, nheads, seqlen, 1), the raw normaliser r.
        extra (Tensor, optional): (batch, seqlen, nheads * e), P: LePE's output
            (plus the shortcut), any dtype; None: 0.
        const (float): c.
        dtype (torch.dtype): the output's.

    Returns:
        Tensor: (batch, seqlen, nheads * e).
    """
    y = num / const if den is None else num / (den + const)
    y = y.transpose(1, 2)  # (batch, seqlen, nheads, e): a view, laid out by the add
    if extra is not None:
        # P (tokens-major) first: the sum takes its layout
        y = extra.unflatten(-1, y.shape[-2:]) + y
    return y.reshape(*y.shape[:2], -1).to(dtype)


def _fused(t: Tensor) -> bool:
    return use_triton(t) and t.dtype in TRITON_DTYPES


def mlla_features_auto(qk: Tensor, nheads: int,
                       table: Optional[HeadTable] = None) -> Tuple[Tensor, Tensor]:
    """:func:`mlla_features`, by the fused kernels where they run
    (:func:`mmdinomamba.ops.backend.use_triton`: CUDA, not under ``torch.compile``;
    :func:`mmdinomamba.ops.triton.mlla_features_triton`)."""
    if _fused(qk) and (table is None or table[0].dtype == torch.float32):
        from .triton import mlla_features_triton
        return mlla_features_triton(qk, nheads, table)
    return mlla_features(qk, nheads, table)


def mlla_output(num: Tensor, den: Optional[Tensor], extra: Optional[Tensor],
                const: float, dtype: torch.dtype) -> Tensor:
    """:func:`mlla_output_ref`, by one fused kernel where they run
    (:func:`mmdinomamba.ops.triton.mlla_output_triton`)."""
    if _fused(num) and num.dtype == torch.float32 and dtype in TRITON_DTYPES:
        from .triton import mlla_output_triton
        return mlla_output_triton(num, den, extra, const, dtype)
    return mlla_output_ref(num, den, extra, const, dtype)
