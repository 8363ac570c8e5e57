"""Rank measures against torch.linalg.matrix_rank and closed forms."""
import math

import pytest
import torch

from mmdinomamba.analysis.rank import (block_rank_summary, block_ranks, chunk_sizes,
                                       effective_rank, numerical_rank, rank_measures,
                                       singular_values)


def low_rank(rows, cols, rank, dtype=torch.float64, batch=(), seed=0):
    """A random matrix of exactly ``rank`` (its nonzero singular values are O(1))."""
    g = torch.Generator().manual_seed(seed)
    U = torch.randn(*batch, rows, rank, generator=g, dtype=torch.float64)
    V = torch.randn(*batch, cols, rank, generator=g, dtype=torch.float64)
    return (U @ V.transpose(-1, -2)).to(dtype)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('shape,rank', [((12, 12), 5), ((9, 14), 9), ((20, 7), 3),
                                        ((6, 6), 6), ((5, 8), 0)])
def test_numerical_rank_matches_torch(dtype, shape, rank):
    M = low_rank(*shape, rank, dtype, batch=(3, ))
    ours = numerical_rank(M)
    assert torch.equal(ours, torch.linalg.matrix_rank(M))
    assert (ours == rank).all()


@pytest.mark.parametrize('rtol,atol', [(None, 0.0), (1e-3, 0.0), (None, 0.5),
                                       (0.2, 1.0), (0.0, 0.0)])
def test_tolerance_rules_match_torch(rtol, atol):
    # graded spectrum 10^0 .. 10^-11 so every tolerance rule cuts somewhere else
    g = torch.Generator().manual_seed(1)
    Q1, _ = torch.linalg.qr(torch.randn(12, 12, generator=g, dtype=torch.float64))
    Q2, _ = torch.linalg.qr(torch.randn(12, 12, generator=g, dtype=torch.float64))
    S = 10.0 ** -torch.arange(12, dtype=torch.float64)
    M = 3 * Q1 @ torch.diag(S) @ Q2.T
    kwargs = dict(atol=atol) if rtol is None else dict(atol=atol, rtol=rtol)
    assert numerical_rank(M, rtol, atol).item() == \
        torch.linalg.matrix_rank(M, **kwargs).item()


def test_effective_rank_closed_forms():
    # k equal singular values: p uniform, H = log k, erank = k exactly
    S = torch.tensor([[2.0, 2.0, 2.0, 0.0], [5.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(effective_rank(S), torch.tensor([3.0, 1.0],
                                                               dtype=torch.float64))
    # two values a, b: erank = exp(-(p log p + q log q)), p = a / (a + b)
    p = 3 / 4
    expected = math.exp(-(p * math.log(p) + (1 - p) * math.log(1 - p)))
    got = effective_rank(torch.tensor([3.0, 1.0], dtype=torch.float64)).item()
    assert got == pytest.approx(expected, rel=1e-14)
    assert effective_rank(torch.zeros(3, dtype=torch.float64)).item() == 0.0
    # scale invariant, between 1 and the rank
    M = low_rank(10, 10, 4)
    e = effective_rank(singular_values(M)).item()
    assert 1.0 <= e <= 4.0
    assert effective_rank(singular_values(7 * M)).item() == pytest.approx(e, rel=1e-12)


@pytest.mark.parametrize('seqlen,chunk', [(12, 4), (13, 4), (10, 3), (5, 8), (7, 1)])
def test_block_ranks_match_a_loop(seqlen, chunk):
    g = torch.Generator().manual_seed(seqlen * 10 + chunk)
    # a matrix whose blocks have different ranks: low-rank plus a few sparse entries
    M = low_rank(seqlen, seqlen, 2, batch=(2, ), seed=seqlen)
    M = M + (torch.rand(2, seqlen, seqlen, generator=g) < 0.1).double()
    ranks = block_ranks(M, chunk)
    starts = list(range(0, seqlen, chunk))
    assert ranks.shape == (2, len(starts), len(starts))
    for b in range(2):
        for i, r0 in enumerate(starts):
            for j, c0 in enumerate(starts):
                block = M[b, r0:r0 + chunk, c0:c0 + chunk]
                assert ranks[b, i, j].item() == torch.linalg.matrix_rank(block).item()


def test_block_rank_summary_on_a_constructed_table():
    ranks = torch.tensor([[4, 0, 0], [2, 3, 0], [1, 2, 2]])
    s = block_rank_summary(ranks, [4, 4, 2])
    assert (s['diag_min'].item(), s['diag_max'].item()) == (2, 4)
    assert s['diag_deficit_max'].item() == 1  # the middle block: 4 - 3
    assert s['offdiag_max'].item() == 2
    assert s['offdiag_mean'].item() == pytest.approx(1.0)  # blocks (0,1), (1,0)
    # chunks of 4, 4, 4: the mean runs over all six off-diagonal blocks
    even = block_rank_summary(ranks, [4, 4, 4])
    assert even['offdiag_mean'].item() == pytest.approx(5 / 6)
    assert (s['lower_offdiag_max'].item(), s['upper_offdiag_max'].item()) == (2, 0)
    one = block_rank_summary(torch.tensor([[3]]), [3])
    assert one['offdiag_max'].item() == 0 and one['diag_deficit_max'].item() == 0


def test_rank_measures_shapes():
    M = low_rank(9, 9, 3, batch=(2, 4))
    m = rank_measures(M, chunk=4)
    assert m['singular_values'].shape == (2, 4, 9)
    assert m['block_ranks'].shape == (2, 4, 3, 3)
    for key in ('rank', 'effective_rank', 'tolerance', 'offdiag_max', 'diag_min'):
        assert m[key].shape == (2, 4)
    assert (m['rank'] == 3).all()


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match='NaN or Inf'):
        numerical_rank(torch.tensor([[1.0, float('nan')], [0.0, 1.0]]))
    with pytest.raises(ValueError, match='square'):
        block_ranks(torch.zeros(3, 4), 2)
    with pytest.raises(ValueError, match='positive int'):
        block_ranks(torch.zeros(4, 4), 0)
    with pytest.raises(ValueError, match='floating-point'):
        numerical_rank(torch.eye(3, dtype=torch.int64))
    with pytest.raises(ValueError, match='>= 0'):
        numerical_rank(torch.eye(3), rtol=-1.0)
    assert chunk_sizes(10, 4) == [4, 4, 2]
