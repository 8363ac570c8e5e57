"""ssd_decay_mask against its definition, entry by entry."""
import math

import torch

from mmdinomamba.ops import ssd_decay_mask, ssd_mixing_matrix


def test_decay_mask_matches_a_loop():
    g = torch.Generator().manual_seed(0)
    batch, seqlen, nheads = 2, 7, 3
    dt = torch.randn(batch, seqlen, nheads, generator=g, dtype=torch.float64)
    A = -torch.rand(nheads, generator=g, dtype=torch.float64) * 2
    dt_bias = torch.randn(nheads, generator=g, dtype=torch.float64)
    L = ssd_decay_mask(dt, A, dt_bias, dt_softplus=True)
    step = torch.nn.functional.softplus(dt + dt_bias)
    for b in range(batch):
        for h in range(nheads):
            for i in range(seqlen):
                for j in range(seqlen):
                    expected = (math.exp(sum(step[b, k, h].item() * A[h].item()
                                             for k in range(j + 1, i + 1)))
                                if i >= j else 0.0)
                    # float64 sums of <= 7 O(1) terms: round-off far below 1e-12
                    assert abs(L[b, h, i, j].item() - expected) <= 1e-12


def test_mixing_matrix_is_mask_times_scores():
    g = torch.Generator().manual_seed(1)
    dt = torch.rand(1, 5, 2, generator=g, dtype=torch.float64)
    A = -torch.rand(2, generator=g, dtype=torch.float64)
    B, C = (torch.randn(1, 5, 1, 3, generator=g, dtype=torch.float64) for _ in range(2))
    M = ssd_mixing_matrix(dt, A, B, C)
    scores = torch.einsum('bin,bjn->bij', C[:, :, 0], B[:, :, 0])[:, None]
    expected = ssd_decay_mask(dt, A) * scores * dt.transpose(1, 2)[:, :, None, :]
    torch.testing.assert_close(M, expected, rtol=1e-13, atol=1e-13)
