"""SSDMixer against a composition written out here from the naive recurrence."""
import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.models.mixers import SSDMixer
from mmdinomamba.ops import ssd_ref

DIM, D_STATE, HEADDIM = 16, 4, 8


def build(bidirectional=True, ngroups=1, **kw):
    torch.manual_seed(0)
    mixer = SSDMixer(DIM, d_state=D_STATE, headdim=HEADDIM, ngroups=ngroups,
                     chunk_size=4, bidirectional=bidirectional, **kw).double()
    # move every parameter away from its initialisation so swaps would show
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return mixer


def causal_depthwise_conv(seq, weight, bias):
    """seq (batch, seqlen, ch); weight (ch, 1, k): out_t = sum_i w[k-1-i] seq_{t-i} + b."""
    k = weight.shape[-1]
    out = torch.zeros_like(seq) + bias
    for t in range(seq.shape[1]):
        for i in range(k):
            if t - i >= 0:
                out[:, t] += weight[:, 0, k - 1 - i] * seq[:, t - i]
    return out


def one_direction(mixer, zxbcdt, conv, dt_bias, A_log, D, norm_weight):
    d_inner, nheads, ng = mixer.d_inner, mixer.nheads, mixer.ngroups
    z, xBC, dt = zxbcdt.split([d_inner, d_inner + 2 * ng * D_STATE, nheads], -1)
    xBC = F.silu(causal_depthwise_conv(xBC, conv.weight, conv.bias))
    x, B, C = xBC.split([d_inner, ng * D_STATE, ng * D_STATE], -1)
    b, l = x.shape[:2]
    y = ssd_ref(x.reshape(b, l, nheads, HEADDIM), dt, -torch.exp(A_log),
                B.reshape(b, l, ng, D_STATE), C.reshape(b, l, ng, D_STATE), D=D,
                dt_bias=dt_bias, dt_softplus=True).reshape(b, l, d_inner)
    g = (y * z * torch.sigmoid(z)).reshape(b, l, ng, d_inner // ng)
    g = g / torch.sqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)
    return g.reshape(b, l, d_inner) * norm_weight


@pytest.mark.parametrize('bidirectional', [True, False])
@pytest.mark.parametrize('ngroups', [1, 2])
@pytest.mark.parametrize('seqlen', [1, 6, 9])
def test_mixer_equals_composition(bidirectional, ngroups, seqlen):
    mixer = build(bidirectional, ngroups)
    u = torch.randn(2, seqlen, DIM, dtype=torch.float64)
    m = mixer
    zxbcdt = u @ m.in_proj.weight.T
    y = one_direction(m, zxbcdt, m.conv1d, m.dt_bias, m.A_log, m.D, m.norm.weight)
    if bidirectional:
        y_b = one_direction(m, zxbcdt.flip(1), m.conv1d_b, m.dt_b_bias, m.A_log_b,
                            m.D_b, m.norm_b.weight).flip(1)
        y = (y + y_b) / 2
    expected = y @ m.out_proj.weight.T
    torch.testing.assert_close(mixer(u), expected, rtol=1e-10, atol=1e-12)


def test_mixing_matrices_reproduce_ssd_output():
    mixer = build()
    u = torch.randn(1, 7, DIM, dtype=torch.float64)
    zxbcdt = mixer.in_proj(u)
    Ms = mixer.mixing_matrices(u)
    for direction, M in Ms.items():
        flip = direction == 'backward'
        a = mixer.ssd_inputs(zxbcdt.flip(1) if flip else zxbcdt, direction)
        y = ssd_ref(a['x'], a['dt'], a['A'], a['B'], a['C'], D=a['D'],
                    dt_bias=a['dt_bias'], dt_softplus=True)
        x = a['x']
        if flip:
            y, x = y.flip(1), x.flip(1)
        torch.testing.assert_close(torch.einsum('bhij,bjhp->bihp', M, x), y,
                                   rtol=1e-10, atol=1e-12)
    assert torch.all(Ms['forward'].triu(1) == 0)
    assert torch.all(Ms['backward'].tril(-1) == 0)


def test_parameter_names_follow_official_layout():
    names = {n for n, _ in build().named_parameters()}
    assert names == {
        'in_proj.weight', 'out_proj.weight', 'conv1d.weight', 'conv1d.bias',
        'conv1d_b.weight', 'conv1d_b.bias', 'dt_bias', 'dt_b_bias', 'A_log',
        'A_log_b', 'D', 'D_b', 'norm.weight', 'norm_b.weight'
    }
    causal = {n for n, _ in build(bidirectional=False).named_parameters()}
    assert not any(n.endswith('_b') or '_b.' in n or 'dt_b_' in n for n in causal)


@pytest.mark.parametrize('bidirectional,conv_bias,bias', [(True, True, False),
                                                            (False, False, True)])
def test_core_params_are_the_named_parameters(bidirectional, conv_bias, bias):
    mixer = SSDMixer(32, d_state=8, headdim=8, bidirectional=bidirectional,
                     conv_bias=conv_bias, bias=bias)
    p = mixer.core_params()
    suffixes = ['', '_b'] if bidirectional else ['']
    assert p.conv_w == tuple(getattr(mixer, 'conv1d' + s).weight for s in suffixes)
    assert p.conv_b == (tuple(getattr(mixer, 'conv1d' + s).bias for s in suffixes)
                        if conv_bias else None)
    assert p.dt_bias == tuple(getattr(mixer, n) for n in ['dt_bias', 'dt_b_bias'][
        :len(suffixes)])
    assert p.A_log == tuple(getattr(mixer, 'A_log' + s) for s in suffixes)
    assert p.D == tuple(getattr(mixer, 'D' + s) for s in suffixes)
    assert p.norm_w == tuple(getattr(mixer, 'norm' + s).weight for s in suffixes)
    assert p.out_w is mixer.out_proj.weight and p.out_b is mixer.out_proj.bias
    assert (p.out_b is None) != bias
    # a parameter registered anew is the one read (nothing is cached)
    mixer.A_log = torch.nn.Parameter(torch.zeros_like(mixer.A_log))
    assert mixer.core_params().A_log[0] is mixer.A_log


def test_initialisation_ranges():
    torch.manual_seed(0)
    m = SSDMixer(256)
    A = torch.exp(m.A_log)
    assert torch.all((A >= 1) & (A <= 16))
    dt = F.softplus(m.dt_bias)
    assert torch.all((dt >= 1e-3 - 1e-7) & (dt <= 0.1 + 1e-7))
    assert torch.all(m.D == 1)
    assert m.in_proj.out_features == 2 * 512 + 2 * 64 + 8


@pytest.mark.parametrize('kwargs,match', [
    (dict(headdim=7), 'headdim'),
    (dict(ngroups=3), 'ngroups'),
    (dict(ssd_backend='fast'), 'ssd_backend'),
    (dict(A_init_range=(0, 1)), 'A_init_range'),
])
def test_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SSDMixer(DIM, **{'d_state': D_STATE, 'headdim': HEADDIM, **kwargs})


def test_bad_input_shape():
    with pytest.raises(ValueError, match='input must have shape'):
        build()(torch.randn(2, 5, DIM + 1, dtype=torch.float64))


def test_backward_runs_and_reaches_both_directions():
    mixer = build().float()
    mixer(torch.randn(2, 5, DIM)).sum().backward()
    for name in ('A_log', 'A_log_b', 'D_b', 'dt_b_bias', 'conv1d_b.weight'):
        grad = mixer.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_auto_chunk_is_the_same_function():
    """chunk_size='auto' (one chunk up to 128 tokens, else 64) computes what any
    fixed chunk computes, in float64 to rounding; a bad chunk size is refused."""
    from mmdinomamba.ops.spec import auto_chunk_size
    assert [auto_chunk_size(n) for n in (1, 66, 128, 129, 258)] == [1, 66, 128, 64, 64]
    torch.manual_seed(0)
    auto = SSDMixer(DIM, d_state=8, headdim=8).double()
    assert auto.chunk_size == 'auto'
    fixed = SSDMixer(DIM, d_state=8, headdim=8, chunk_size=7).double()
    fixed.load_state_dict(auto.state_dict())
    for seqlen in (5, 150):
        u = torch.randn(2, seqlen, DIM, dtype=torch.float64)
        torch.testing.assert_close(auto(u), fixed(u), rtol=1e-10, atol=1e-12)
    for bad in (0, -4, 'big', 2.5):
        with pytest.raises(ValueError, match='chunk_size'):
            SSDMixer(DIM, d_state=8, headdim=8, chunk_size=bad)
