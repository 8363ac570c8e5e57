"""Materialised mixing matrices: M X reproduces each mixer's token mixing, and the
rank facts the algebra guarantees hold on constructed and random cases.

Tolerances: everything runs in float64 on O(1) values with sequences of at most
48 tokens; a product M X sums at most 48 terms, so round-off stays below
~1e-14. 1e-11 (absolute and relative) leaves room and still fails on any wrong
scale, mask entry or flip, which move results by far more than 1e-6.
"""
import pytest
import torch

from mmdinomamba.analysis.mixing import (capture_mixer_inputs, find_mixer,
                                         mixer_info, mixing_matrices, mixing_values,
                                         softmax_attention_matrix, ssd_decay_masks)
from mmdinomamba.analysis.rank import block_ranks, numerical_rank
from mmdinomamba.models import LinearAttention, SSDMixer
from mmdinomamba.ops import ssd_decay_mask, ssd_mixing_matrix, ssd_ref
from mmdinomamba.ops.linear_attention import linear_attention, linear_attention_matrix
from tests.factories import dinovim, linear_vit

TOL = dict(rtol=1e-11, atol=1e-11)
DIM = 16


def perturbed(module, seed=0, scale=0.1):
    """Move every parameter away from its initialisation (so swaps would show)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return module


def ssd_mixer(bidirectional=True, ngroups=1, d_conv=4):
    torch.manual_seed(0)
    mixer = SSDMixer(DIM, d_state=4, headdim=8, ngroups=ngroups, d_conv=d_conv,
                     chunk_size=4, bidirectional=bidirectional, ssd_backend='chunked')
    return perturbed(mixer.double())


def apply(M, X):
    """(batch, nheads, seqlen, seqlen) x (batch, nheads, seqlen, headdim)."""
    return torch.einsum('bhij,bhjp->bhip', M, X)


def pre_norm_outputs(mixer, u):
    """The tensors entering each direction's gated norm during mixer.forward (the
    PyTorch core normalises direction 0, then direction 1)."""
    import mmdinomamba.ops.mixer as core
    seen, norm = [], core.gated_rms_norm

    def spy(y, *args, **kwargs):
        seen.append(y)
        return norm(y, *args, **kwargs)

    core.gated_rms_norm = spy
    try:
        mixer(u)
    finally:
        core.gated_rms_norm = norm
    return dict(zip(mixer.directions, seen))


# --------------------------------------------------------------------------- #
# M X reproduces the mixer's own token mixing
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize('bidirectional', [True, False])
@pytest.mark.parametrize('ngroups', [1, 2])
@pytest.mark.parametrize('seqlen', [1, 9])
def test_ssd_matrix_times_x_is_the_pre_norm_output(bidirectional, ngroups, seqlen):
    mixer = ssd_mixer(bidirectional, ngroups)
    u = torch.randn(2, seqlen, DIM, dtype=torch.float64)
    mats, values = mixing_matrices(mixer, u), mixing_values(mixer, u)
    assert set(mats) == set(mixer_info(mixer).keys)
    seen = pre_norm_outputs(mixer, u)
    zxbcdt = mixer.in_proj(u)
    for direction in mixer.directions:
        flip = direction == 'backward'
        got = apply(mats[direction], values[direction])  # (batch, nheads, seqlen, p)
        got_seq = got.permute(0, 2, 1, 3).reshape(2, seqlen, -1)
        # 1) the mixer's own forward: what enters the gated RMSNorm
        expected = seen[direction].flip(1) if flip else seen[direction]
        torch.testing.assert_close(got_seq, expected, **TOL)
        # 2) the naive recurrence on the mixer's SSD inputs
        a = mixer.ssd_inputs(zxbcdt.flip(1) if flip else zxbcdt, direction)
        y = ssd_ref(a['x'], a['dt'], a['A'], a['B'], a['C'], D=a['D'],
                    dt_bias=a['dt_bias'], dt_softplus=True)
        y = y.flip(1) if flip else y
        torch.testing.assert_close(got.permute(0, 2, 1, 3), y, **TOL)
    if bidirectional:
        # combined: exact as [M_f / 2, M_b / 2] acting on [x_f; x_b]
        average = (seen['forward'] + seen['backward'].flip(1)) / 2
        got = (apply(mats['forward'], values['forward']) +
               apply(mats['backward'], values['backward'])) / 2
        torch.testing.assert_close(got.permute(0, 2, 1, 3).reshape(2, seqlen, -1),
                                   average, **TOL)
        torch.testing.assert_close(mats['combined'],
                                   (mats['forward'] + mats['backward']) / 2)


def test_combined_matrix_mixes_shared_values():
    """With one shared value stream (kernel-1 convs, equal weights) the combined
    matrix alone maps x to the average of the two pre-norm outputs."""
    mixer = ssd_mixer(d_conv=1)
    with torch.no_grad():
        mixer.conv1d_b.weight.copy_(mixer.conv1d.weight)
        mixer.conv1d_b.bias.copy_(mixer.conv1d.bias)
    u = torch.randn(2, 7, DIM, dtype=torch.float64)
    values = mixing_values(mixer, u)
    torch.testing.assert_close(values['forward'], values['backward'], **TOL)
    seen = pre_norm_outputs(mixer, u)
    average = (seen['forward'] + seen['backward'].flip(1)) / 2
    got = apply(mixing_matrices(mixer, u)['combined'], values['forward'])
    torch.testing.assert_close(got.permute(0, 2, 1, 3).reshape(2, 7, -1), average,
                               **TOL)


def proj_input(attn, u):
    """What ``attn(u)`` hands its output projection: the heads' outputs, joined."""
    seen = []
    handle = attn.proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    attn(u)
    handle.remove()
    return seen[0]


def test_linear_matrix_times_v_is_the_attention_output():
    torch.manual_seed(0)
    attn = perturbed(LinearAttention(DIM, num_heads=4).double(), scale=0.5)
    u = torch.randn(2, 11, DIM, dtype=torch.float64)
    M = mixing_matrices(attn, u)['attention']
    V = mixing_values(attn, u)['attention']
    got = apply(M, V)
    torch.testing.assert_close(got.permute(0, 2, 1, 3).reshape(2, 11, DIM),
                               proj_input(attn, u), **TOL)
    q, k, v = attn._qkv(u)
    torch.testing.assert_close(got, linear_attention(q, k, v), **TOL)


@pytest.mark.parametrize('qk_scale', [None, 0.7])
def test_softmax_matrix_times_v_is_mmpretrain_attention(qk_scale):
    from mmpretrain.models.utils.attention import MultiheadAttention
    torch.manual_seed(0)
    attn = perturbed(MultiheadAttention(DIM, num_heads=4, qk_scale=qk_scale),
                     scale=0.5).double().eval()
    u = torch.randn(2, 11, DIM, dtype=torch.float64)
    M = mixing_matrices(attn, u)['attention']
    V = mixing_values(attn, u)['attention']
    torch.testing.assert_close(apply(M, V).permute(0, 2, 1, 3).reshape(2, 11, DIM),
                               proj_input(attn, u), **TOL)
    torch.testing.assert_close(M.sum(-1), torch.ones(2, 4, 11, dtype=torch.float64))


def test_float32_mixer_is_materialised_in_float64():
    mixer = ssd_mixer().float()
    u = torch.randn(1, 5, DIM)
    mats = mixing_matrices(mixer, u)
    assert all(M.dtype == torch.float64 for M in mats.values())
    assert next(mixer.parameters()).dtype == torch.float32  # the mixer is untouched
    with pytest.raises(ValueError, match='NaN or Inf'):
        mixing_matrices(mixer, torch.full((1, 5, DIM), float('nan')))
    with pytest.raises(ValueError, match='not a known token mixer'):
        mixing_matrices(torch.nn.Linear(DIM, DIM), u)


# --------------------------------------------------------------------------- #
# Capturing the mixer input inside a backbone
# --------------------------------------------------------------------------- #
def tiny_dinovim():
    return dinovim(32, 3, img_size=32, drop_path_rate=0.0,
                   mixer_cfg=dict(d_state=8, headdim=16, ssd_backend='chunked'))


def tiny_linear_vit():
    return linear_vit(32, 3, img_size=32, drop_path_rate=0.0)


@pytest.mark.parametrize('build,norm', [(tiny_dinovim, 'norm'),
                                        (tiny_linear_vit, 'norm1')])
def test_capture_mixer_inputs(build, norm):
    backbone = build().eval()
    x = torch.randn(2, 3, 32, 32)
    got = capture_mixer_inputs(backbone, x, [0, -2])
    assert sorted(got) == [0, 1]
    with torch.no_grad():
        tokens, _ = backbone.embed(x)
        # the stream entering block i is the 'residual' output of block i - 1
        stream = backbone.forward_tokens(tokens, [0], feature_source='residual')[0]
        expected = {0: getattr(backbone.layers[0], norm)(tokens.float()),
                    1: getattr(backbone.layers[1], norm)(stream)}
    for i in (0, 1):
        torch.testing.assert_close(got[i], expected[i], rtol=1e-5, atol=1e-5)
    # the pass stopped after layer 1 and left no hooks behind
    calls = []
    last = find_mixer(backbone.layers[2])
    handle = last.register_forward_pre_hook(lambda m, a: calls.append(1))
    capture_mixer_inputs(backbone, x, [1])
    assert calls == []
    handle.remove()
    assert all(not find_mixer(layer)._forward_pre_hooks for layer in backbone.layers)
    with pytest.raises(ValueError, match='out of range'):
        capture_mixer_inputs(backbone, x, [3])
    # out_indices that end early do not hide later layers
    backbone.out_indices = [0]
    torch.testing.assert_close(capture_mixer_inputs(backbone, x, [2])[2],
                               capture_mixer_inputs(backbone, x, [0, 2])[2])


# --------------------------------------------------------------------------- #
# What the algebra guarantees (torch.linalg.matrix_rank is the reference)
# --------------------------------------------------------------------------- #
def ssd_case(seqlen, nheads, dstate, seed, dt_range=(0.05, 0.3), A_range=(0.5, 2.0)):
    """Random SSD inputs with moderate decays: dt * |A| in [0.025, 0.6] per token."""
    g = torch.Generator().manual_seed(seed)
    f64 = dict(generator=g, dtype=torch.float64)
    dt = dt_range[0] + (dt_range[1] - dt_range[0]) * torch.rand(1, seqlen, nheads,
                                                                 **f64)
    A = -(A_range[0] + (A_range[1] - A_range[0]) * torch.rand(nheads, **f64))
    B = torch.randn(1, seqlen, 1, dstate, **f64)
    C = torch.randn(1, seqlen, 1, dstate, **f64)
    return dt, A, B, C


def offdiag_blocks(M, chunk):
    seqlen = M.shape[-1]
    starts = range(0, seqlen, chunk)
    return [M[..., i:i + chunk, j:j + chunk] for i in starts for j in starts if i != j]


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_noncausal_linear_attention_global_rank_at_most_dqk(seed):
    g = torch.Generator().manual_seed(seed)
    d_qk, seqlen = 6, 40
    q, k = (torch.randn(1, 3, seqlen, d_qk, generator=g, dtype=torch.float64) * 2
            for _ in range(2))
    M = linear_attention_matrix(q, k)
    ranks = torch.linalg.matrix_rank(M)
    assert (ranks <= d_qk).all()
    assert (ranks == d_qk).all()  # generic inputs reach the bound
    assert torch.equal(numerical_rank(M), ranks)
    # constructed: identical keys make every row the same -> rank 1
    M1 = linear_attention_matrix(q, k[:, :, :1].expand_as(k))
    assert (torch.linalg.matrix_rank(M1) == 1).all()


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('dstate,chunk', [(2, 8), (3, 6)])
def test_ssd_offdiagonal_blocks_rank_at_most_n(seed, dstate, chunk):
    seqlen, nheads = 40, 3
    dt, A, B, C = ssd_case(seqlen, nheads, dstate, seed)
    M = ssd_mixing_matrix(dt, A, B, C, D=torch.ones(nheads, dtype=torch.float64))
    L = ssd_decay_mask(dt, A)
    block_max = 0
    for block in offdiag_blocks(M, chunk):
        r = torch.linalg.matrix_rank(block)
        assert (r <= dstate).all()
        block_max = max(block_max, int(r.max()))
    assert block_max == dstate  # the bound N is reached, and N < chunk
    # the mask alone: rank 1 strictly below the diagonal, 0 above
    for i in range(0, seqlen, chunk):
        for j in range(0, seqlen, chunk):
            if i != j:
                expected = 1 if i > j else 0
                got = torch.linalg.matrix_rank(L[..., i:i + chunk, j:j + chunk])
                assert (got == expected).all()
    # while the whole mask, as the paper's rank(L_M), is full rank
    assert (torch.linalg.matrix_rank(L) == seqlen).all()
    # block_ranks agrees with the loop
    ours = block_ranks(M, chunk)
    n = ours.shape[-1]
    assert ours[..., ~torch.eye(n, dtype=torch.bool)].max().item() == dstate


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('with_skip', [True, False])
def test_ssd_global_rank_is_seqlen(seed, with_skip):
    seqlen, nheads, dstate = 32, 3, 2
    dt, A, B, C = ssd_case(seqlen, nheads, dstate, seed)
    D = torch.ones(nheads, dtype=torch.float64) if with_skip else None
    M = ssd_mixing_matrix(dt, A, B, C, D=D)
    # far above the state size: a linear attention with D_QK = N would be rank 2
    assert (torch.linalg.matrix_rank(M) == seqlen).all()
    assert (numerical_rank(M) == seqlen).all()


def test_bidirectional_mixer_blocks_rank_at_most_n():
    torch.manual_seed(0)
    mixer = perturbed(SSDMixer(DIM, d_state=2, headdim=8, chunk_size=4).double(),
                      scale=0.5)
    u = torch.randn(1, 24, DIM, dtype=torch.float64)
    mats = mixing_matrices(mixer, u)
    masks = ssd_decay_masks(mixer, u)
    assert torch.equal(masks['backward'], masks['backward'].triu())
    for key in ('forward', 'backward', 'combined'):
        for block in offdiag_blocks(mats[key], 6):
            assert (torch.linalg.matrix_rank(block) <= 2).all()
        assert (torch.linalg.matrix_rank(mats[key]) == 24).all()


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_softmax_attention_full_rank(seed):
    g = torch.Generator().manual_seed(seed)
    seqlen, d = 24, 8
    q, k = (torch.randn(1, 2, seqlen, d, generator=g, dtype=torch.float64)
            for _ in range(2))
    M = softmax_attention_matrix(q, k, d ** -0.5)
    # the logits q k^T have rank d = 8, yet exp makes M full rank
    assert (torch.linalg.matrix_rank(M) == seqlen).all()
    assert (numerical_rank(M) == seqlen).all()
    assert all((torch.linalg.matrix_rank(b) == 8).all() for b in offdiag_blocks(M, 8))


def _every_mixer():
    """One of each kind of mixer, float64, with its parameters moved."""
    from mmpretrain.models.utils.attention import MultiheadAttention

    from mmdinomamba.analysis.adapters import as_mixer
    from mmdinomamba.models import LinearAttentionMixer
    torch.manual_seed(0)
    return [ssd_mixer(), perturbed(LinearAttention(DIM, num_heads=2)).double(),
            as_mixer(perturbed(MultiheadAttention(DIM, num_heads=2)).double()),
            perturbed(LinearAttentionMixer(DIM, 2, rope=True, lepe=True)).double()]


def test_every_mixer_takes_the_grid_one_way():
    """forward, mixing_matrices and mixing_values all take (u, hw): the mixers
    that need no grid give the same with and without it; a grid mixer refuses
    to run without one and with one that does not hold the tokens."""
    u = torch.randn(1, 12, DIM, dtype=torch.float64)
    for mixer in _every_mixer():
        info = mixer.mixing_info()
        for method in ('mixing_matrices', 'mixing_values'):
            with_grid = getattr(mixer, method)(u, (3, 4))
            assert set(with_grid) <= set(info.keys)
            if not info.grid:
                without = getattr(mixer, method)(u)
                assert all(torch.equal(with_grid[k], without[k]) for k in with_grid)
        if info.kind == 'softmax':
            continue  # the adapter wraps mmpretrain's module, whose forward is its own
        out = mixer(u, (3, 4))
        assert out.shape == u.shape
        if info.grid:
            for method in (mixer, mixer.mixing_matrices, mixer.mixing_values):
                with pytest.raises(ValueError, match='pass hw='):
                    method(u)
                with pytest.raises(ValueError, match='do not fill the grid'):
                    method(u, (3, 5))
        else:
            torch.testing.assert_close(out, mixer(u), rtol=0, atol=0)
