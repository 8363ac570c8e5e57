"""MLLA's attention (mmdinomamba.ops.mlla) against its slow twins: the fast
associative form against the formed mixing matrix, the chunked forget gate against
the token-by-token recurrence (a scalar per head and one per channel), the
per-head feature map and rotation against ELU + 1 and rope_2d per tensor; forward
and gradients, in float64 (the two differ only by rounding: 1e-10 is far below
any error of the formulas, which would be O(1))."""
import pytest
import torch

from mmdinomamba.models.mixers.positional import rope_2d, rope_2d_table
from mmdinomamba.ops.mlla import (gated_linear_attention, gated_linear_attention_ref,
                                  gla_mixing_matrix, linear_attention_heads,
                                  mlla_attention, mlla_attention_ref, mlla_features,
                                  mlla_features_ref, rope_head_table, values_per_head)

F64 = dict(rtol=1e-10, atol=1e-10)


def inputs(batch=2, heads=3, n=37, d=4, e=6, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)

    def pos(*shape):  # feature-mapped Q and K are positive
        return (torch.rand(*shape, generator=g, dtype=torch.float64) + 0.1)

    q, k = pos(batch, heads, n, d), pos(batch, heads, n, d)
    q_r, k_r = (torch.randn(batch, heads, n, d, generator=g, dtype=torch.float64)
                for _ in range(2))
    v = torch.randn(batch, heads, n, e, generator=g, dtype=torch.float64)
    ts = [q, k, q_r, k_r, v]
    for t in ts:
        t.requires_grad_(requires_grad)
    return ts


def grads(out, ts):
    """Gradients of a fixed weighting of ``out`` (zeros where ``out`` does not
    depend on an input: Q and K without the normaliser)."""
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    gs = torch.autograd.grad((out * w).sum(), ts, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(gs, ts)]


@pytest.mark.parametrize('normalize', [True, False])
@pytest.mark.parametrize('d,e', [(4, 4), (2, 6)])
def test_attention_is_its_mixing_matrix(normalize, d, e):
    ts = inputs(d=d, e=e)
    fast = mlla_attention(*ts, eps=1e-6, normalize=normalize)
    slow = mlla_attention_ref(*ts, eps=1e-6, normalize=normalize)
    torch.testing.assert_close(fast, slow, **F64)
    for a, b in zip(grads(fast, ts), grads(slow, ts)):
        torch.testing.assert_close(a, b, **F64)


def test_attention_by_hand():
    """One head, two tokens, numbers small enough to follow: y_i = Q_r,i S z_i."""
    q = torch.tensor([[[[1., 2.], [3., 1.]]]], dtype=torch.float64)
    k = torch.tensor([[[[2., 1.], [1., 1.]]]], dtype=torch.float64)
    q_r = torch.tensor([[[[1., 0.], [0., 1.]]]], dtype=torch.float64)
    k_r = torch.tensor([[[[1., 1.], [2., 0.]]]], dtype=torch.float64)
    v = torch.tensor([[[[1.], [2.]]]], dtype=torch.float64)
    # S = (k_r^T v) / 2 = [[5], [1]] / 2; kbar = [1.5, 1]; z = 1 / (3.5, 5.5)
    expected = torch.tensor([[[[2.5 / 3.5], [0.5 / 5.5]]]], dtype=torch.float64)
    torch.testing.assert_close(mlla_attention(q, k, q_r, k_r, v, eps=0.0), expected)
    torch.testing.assert_close(mlla_attention_ref(q, k, q_r, k_r, v, eps=0.0), expected)


@pytest.mark.parametrize('per', ['head', 'channel'])
@pytest.mark.parametrize('normalize', [True, False])
@pytest.mark.parametrize('n,chunk', [(37, None), (37, 8), (16, 16), (5, 8)])
def test_forget_gate_chunks_are_the_recurrence(per, normalize, n, chunk):
    """Across chunk boundaries, a partial last chunk and a single chunk."""
    ts = inputs(n=n)
    width = 1 if per == 'head' else ts[0].shape[-1]
    g = torch.Generator().manual_seed(1)
    log_decay = -torch.rand(2, 3, n, width, generator=g, dtype=torch.float64) * 2
    log_decay.requires_grad_(True)
    fast = gated_linear_attention(*ts, log_decay, 1e-6, normalize, chunk)
    slow = gated_linear_attention_ref(*ts, log_decay, 1e-6, normalize)
    torch.testing.assert_close(fast, slow, **F64)
    for a, b in zip(grads(fast, ts + [log_decay]), grads(slow, ts + [log_decay])):
        torch.testing.assert_close(a, b, **F64)
    # the mixing matrix reproduces it too
    A = gla_mixing_matrix(*ts[:4], log_decay, 1e-6, normalize)
    torch.testing.assert_close(A @ ts[4], slow, **F64)
    assert torch.all(A.triu(1) == 0)  # causal


def test_forget_gate_without_decay_is_causal_linear_attention():
    """l = 0: the running sums of the plain attention (a different formula)."""
    q, k, q_r, k_r, v = inputs(n=9, requires_grad=False)
    y = gated_linear_attention(q, k, q_r, k_r, v, torch.zeros(2, 3, 9, 1,
                                                              dtype=torch.float64))
    w = (q_r @ k_r.transpose(-1, -2)).tril()
    den = (q @ k.transpose(-1, -2)).tril().sum(-1, keepdim=True) + 9 * 1e-6
    torch.testing.assert_close(y, (w @ v) / den, **F64)


def test_strong_decays_stay_finite():
    """Decays of exp(-200) a token: every exponent the chunks take is <= 0, so
    nothing overflows; the state forgets all but the current token."""
    q, k, q_r, k_r, v = inputs(n=20, requires_grad=False)
    for width in (1, 4):
        log_decay = torch.full((2, 3, 20, width), -200.0, dtype=torch.float64)
        y = gated_linear_attention(q, k, q_r, k_r, v, log_decay, eps=0.0)
        assert torch.isfinite(y).all()
        local = ((q_r * k_r).sum(-1, keepdim=True) * v) / (q * k).sum(-1, keepdim=True)
        torch.testing.assert_close(y, local, **F64)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize('hw,heads', [((3, 5), 2), ((4, 4), 1), ((2, 3), 4)])
def test_features_are_elu_plus_one_and_rope_per_tensor(dtype, hw, heads):
    torch.manual_seed(0)
    width = 16
    n = hw[0] * hw[1]
    qk = torch.randn(2, n, 2 * width).to(dtype)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    table = rope_head_table(*rope_2d_table(hw, width, dtype=compute), heads)
    feat, rot = mlla_features(qk, heads, table)
    feat_ref, rot_ref = mlla_features_ref(qk, heads, lambda t: rope_2d(t, hw))
    assert feat.dtype == rot.dtype == compute
    assert feat.shape == rot.shape == (2, 2, heads, n, width // heads)
    assert feat.is_contiguous() and rot.is_contiguous()
    torch.testing.assert_close(feat, feat_ref, rtol=0, atol=0)
    torch.testing.assert_close(rot, rot_ref, rtol=1e-6 if compute == torch.float32
                               else 1e-12, atol=1e-6)
    assert (feat > 0).all()
    plain, same = mlla_features(qk, heads)  # no table: no rotation
    assert same is plain and torch.equal(plain, feat)


def test_feature_gradients_match_the_twin():
    torch.manual_seed(0)
    hw, heads = (3, 4), 2
    qk = torch.randn(2, 12, 16, dtype=torch.float64, requires_grad=True)
    table = rope_head_table(*rope_2d_table(hw, 8, dtype=torch.float64), heads)
    fast = torch.cat(mlla_features(qk, heads, table))
    slow = torch.cat(mlla_features_ref(qk, heads, lambda t: rope_2d(t, hw)))
    w = torch.randn_like(fast)
    torch.testing.assert_close(torch.autograd.grad((fast * w).sum(), qk)[0],
                               torch.autograd.grad((slow * w).sum(), qk)[0], **F64)


def test_values_per_head_is_the_head_split():
    v = torch.randn(2, 5, 6).to(torch.bfloat16)
    out = values_per_head(v, 3)
    assert out.dtype == torch.float32 and out.is_contiguous()
    assert torch.equal(out, v.float().view(2, 5, 3, 2).transpose(1, 2))


def test_dispatch_and_bad_inputs_are_named():
    ts = inputs(requires_grad=False)
    torch.testing.assert_close(linear_attention_heads(*ts, backend='ref'),
                               linear_attention_heads(*ts), **F64)
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        linear_attention_heads(*ts, backend='cuda')
    with pytest.raises(ValueError, match=r'log_decay must be \(batch, nheads'):
        gated_linear_attention(*ts, torch.zeros(2, 3, 37, 3, dtype=torch.float64))
    cos, sin = rope_2d_table((2, 2), 12)
    with pytest.raises(ValueError, match='heads of channel pairs'):
        rope_head_table(cos, sin, 4)  # 3 channels a head
