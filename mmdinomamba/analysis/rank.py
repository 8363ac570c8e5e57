"""Rank measures of token-mixing matrices, batched over leading axes.

Every function takes matrices of shape (..., rows, cols) (e.g. (batch, nheads,
seqlen, seqlen)) and returns one value per matrix.

Numerical rank counts the singular values above a tolerance::

    tol  = max(atol, rtol * sigma_max)
    rtol = max(rows, cols) * eps(dtype)      (default when atol == 0)
    rtol = 0                                 (default when atol > 0)

the convention of ``torch.linalg.matrix_rank`` and, for the default, of NumPy
and LAPACK (``S.max() * max(M.shape) * eps``). ``eps`` is the machine epsilon
of the matrix's own dtype: a float32 matrix carries float32 round-off even when
its singular values are computed in float64.

Effective rank (Roy & Vetterli, "The effective rank: a measure of effective
dimensionality", EUSIPCO 2007) is ``exp(H(p))`` with ``p_k = sigma_k / sum(sigma)``
and ``H`` the Shannon entropy (``0 log 0 = 0``): a real number in [1, rank] that
weighs how evenly the spectrum is spread.

Block ranks cut a square matrix into chunks of ``chunk`` tokens (the last chunk
may be shorter) and take the numerical rank of every block, each block with its
own tolerance (its own shape and largest singular value), so a block's rank
does not depend on how far the rest of the matrix has decayed.
"""
from typing import Dict, Optional, Sequence

import torch

Tensor = torch.Tensor


def _check_matrix(M: Tensor, name: str = 'M') -> None:
    if not isinstance(M, Tensor) or M.dim() < 2:
        raise ValueError(f'{name} must be a tensor of shape (..., rows, cols), got '
                         f'{getattr(M, "shape", type(M))}')
    if not M.is_floating_point():
        raise ValueError(f'{name} must be a floating-point tensor, got {M.dtype}')
    if not torch.isfinite(M).all():
        raise ValueError(f'{name} contains NaN or Inf values')


def default_rtol(rows: int, cols: int, dtype: torch.dtype) -> float:
    """``max(rows, cols) * eps(dtype)``, the LAPACK/NumPy/torch default."""
    return max(rows, cols) * torch.finfo(dtype).eps


def singular_values(M: Tensor) -> Tensor:
    """Singular values in descending order, computed in float64.

    Args:
        M (Tensor): (..., rows, cols).

    Returns:
        Tensor: (..., min(rows, cols)), float64.
    """
    _check_matrix(M)
    return torch.linalg.svdvals(M.to(torch.float64))


def rank_tolerance(S: Tensor, rows: int, cols: int, dtype: torch.dtype,
                   rtol: Optional[float] = None, atol: float = 0.0) -> Tensor:
    """The threshold ``max(atol, rtol * sigma_max)`` (see the module docstring).

    Args:
        S (Tensor): (..., k) singular values in descending order.
        rows, cols (int): shape of the matrices they come from.
        dtype (torch.dtype): dtype the matrices were computed in (sets eps).
        rtol (float, optional): relative tolerance; None for the default.
        atol (float): absolute tolerance. Defaults to 0.

    Returns:
        Tensor: (...,) tolerance per matrix.
    """
    if atol < 0 or (rtol is not None and rtol < 0):
        raise ValueError(f'rank tolerances must be >= 0, got rtol={rtol}, atol={atol}')
    if rtol is None:
        rtol = default_rtol(rows, cols, dtype) if atol == 0 else 0.0
    smax = S[..., 0] if S.shape[-1] else S.new_zeros(S.shape[:-1])
    return torch.clamp(rtol * smax, min=atol)


def numerical_rank(M: Tensor, rtol: Optional[float] = None,
                   atol: float = 0.0) -> Tensor:
    """Number of singular values above the tolerance.

    Args:
        M (Tensor): (..., rows, cols).
        rtol (float, optional): relative tolerance; None for the default.
        atol (float): absolute tolerance. Defaults to 0.

    Returns:
        Tensor: (...,) int64.
    """
    S = singular_values(M)
    tol = rank_tolerance(S, M.shape[-2], M.shape[-1], M.dtype, rtol, atol)
    return (S > tol[..., None]).sum(-1)


def effective_rank(S: Tensor) -> Tensor:
    """``exp`` of the entropy of the normalised singular values (0 for a zero matrix).

    Args:
        S (Tensor): (..., k) singular values (non-negative).

    Returns:
        Tensor: (...,) float64.
    """
    S = S.to(torch.float64)
    total = S.sum(-1, keepdim=True)
    p = torch.where(total > 0, S / total.clamp(min=torch.finfo(S.dtype).tiny), 0.0)
    entropy = -torch.where(p > 0, p * torch.log(p.clamp(min=torch.finfo(S.dtype).tiny)),
                           0.0).sum(-1)
    return torch.where(total[..., 0] > 0, torch.exp(entropy), 0.0)


def chunk_sizes(seqlen: int, chunk: int) -> list:
    """Tokens per chunk when ``seqlen`` tokens are cut into chunks of ``chunk``."""
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f'chunk must be a positive int, got {chunk!r}')
    return [min(chunk, seqlen - start) for start in range(0, seqlen, chunk)]


def block_ranks(M: Tensor, chunk: int, rtol: Optional[float] = None,
                atol: float = 0.0) -> Tensor:
    """Numerical rank of every (chunk x chunk) block of square matrices.

    Args:
        M (Tensor): (..., seqlen, seqlen).
        chunk (int): tokens per chunk c; the last chunk holds the remainder.
        rtol (float, optional): relative tolerance per block; None for the
            default with the block's own shape.
        atol (float): absolute tolerance. Defaults to 0.

    Returns:
        Tensor: (..., nchunks, nchunks) int64; entry (I, J) is the rank of rows
        of chunk I against columns of chunk J. The diagonal holds the diagonal
        blocks.
    """
    _check_matrix(M)
    seqlen = M.shape[-1]
    if M.shape[-2] != seqlen:
        raise ValueError(f'block_ranks: M must be square, got {tuple(M.shape[-2:])}')
    sizes = chunk_sizes(seqlen, chunk)
    nchunks = len(sizes)
    pad = nchunks * chunk - seqlen
    # zero padding adds only zero singular values; tolerances use true block sizes
    Mp = torch.nn.functional.pad(M.to(torch.float64), (0, pad, 0, pad))
    blocks = Mp.unflatten(-1, (nchunks, chunk)).unflatten(-3, (nchunks, chunk))
    blocks = blocks.movedim(-3, -2)  # (..., I, J, chunk, chunk)
    S = torch.linalg.svdvals(blocks)
    ranks = torch.empty(S.shape[:-1], dtype=torch.int64, device=M.device)
    for i, rows in enumerate(sizes):
        for j, cols in enumerate(sizes):
            s = S[..., i, j, :]
            tol = rank_tolerance(s, rows, cols, M.dtype, rtol, atol)
            ranks[..., i, j] = (s > tol[..., None]).sum(-1)
    return ranks


def block_rank_summary(ranks: Tensor, sizes: Sequence[int]) -> Dict[str, Tensor]:
    """Summaries of :func:`block_ranks` per matrix.

    Args:
        ranks (Tensor): (..., nchunks, nchunks) block ranks.
        sizes (Sequence[int]): tokens per chunk (:func:`chunk_sizes`).

    Returns:
        dict: each (...,): ``diag_min`` and ``diag_max`` (ranks of the diagonal
        blocks); ``diag_deficit_max``, the largest ``size - rank`` of a diagonal
        block (0 when all are full rank); ``offdiag_max`` over all blocks
        I != J; ``offdiag_mean`` over the blocks I != J between two full-size
        chunks (over all I != J when fewer than two chunks are full-size, so a
        short last chunk does not pull the mean down); ``lower_offdiag_max``
        (I > J) and
        ``upper_offdiag_max`` (I < J). With a single chunk the off-diagonal
        entries are 0.
    """
    n = ranks.shape[-1]
    if len(sizes) != n:
        raise ValueError(f'{len(sizes)} chunk sizes for {n} chunks')
    eye = torch.eye(n, dtype=torch.bool, device=ranks.device)
    lower = torch.ones(n, n, dtype=torch.bool, device=ranks.device).tril(-1)
    diag = ranks.diagonal(dim1=-2, dim2=-1)
    deficit = torch.as_tensor(list(sizes), device=ranks.device) - diag
    zero = ranks.new_zeros(ranks.shape[:-2])
    off = ranks[..., ~eye]
    full = torch.as_tensor([size == max(sizes) for size in sizes], device=ranks.device)
    pairs = ~eye & full[:, None] & full[None, :]
    mean_over = ranks[..., pairs] if pairs.any() else off
    return dict(
        diag_min=diag.min(-1).values,
        diag_max=diag.max(-1).values,
        diag_deficit_max=deficit.max(-1).values,
        offdiag_max=off.max(-1).values if n > 1 else zero,
        offdiag_mean=mean_over.double().mean(-1) if n > 1 else zero.double(),
        lower_offdiag_max=ranks[..., lower].max(-1).values if n > 1 else zero,
        upper_offdiag_max=ranks[..., lower.T].max(-1).values if n > 1 else zero)


def rank_measures(M: Tensor, chunk: int, rtol: Optional[float] = None,
                  atol: float = 0.0) -> Dict[str, Tensor]:
    """All measures of square mixing matrices at once.

    Args:
        M (Tensor): (..., seqlen, seqlen).
        chunk (int): block size c for the block ranks.
        rtol (float, optional): relative tolerance; None for the default.
        atol (float): absolute tolerance. Defaults to 0.

    Returns:
        dict: ``singular_values`` (..., seqlen) float64; ``rank`` (...,) int64;
        ``tolerance`` (...,); ``effective_rank`` (...,); ``block_ranks``
        (..., nchunks, nchunks); and the entries of :func:`block_rank_summary`.
    """
    S = singular_values(M)
    tol = rank_tolerance(S, M.shape[-2], M.shape[-1], M.dtype, rtol, atol)
    blocks = block_ranks(M, chunk, rtol, atol)
    return dict(singular_values=S, rank=(S > tol[..., None]).sum(-1), tolerance=tol,
                effective_rank=effective_rank(S), block_ranks=blocks,
                **block_rank_summary(blocks, chunk_sizes(M.shape[-1], chunk)))
