"""LinearAttentionMixer: each switch against a naive definition written with loops,
the forget gate against its explicit recurrence, the mixing matrices against the
forward, and the positional encodings against their definitions."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.models.mixers import LinearAttentionMixer, MixerInfo, TokenMixer
from mmdinomamba.models.mixers.positional import (depthwise_conv_matrix, grid_conv,
                                                  rope_2d)

DIM, HEADS, HW = 8, 2, (3, 4)
SWITCHES = ('value_proj', 'rope', 'lepe', 'input_gate', 'forget_gate', 'shortcut')


def perturbed(seed=0, num_heads=HEADS, **switches):
    """A float64 mixer whose every parameter is moved off its initialisation (gates
    included), so that a swapped or ignored parameter shows."""
    torch.manual_seed(seed)
    mixer = LinearAttentionMixer(DIM, num_heads, **switches).double()
    with torch.no_grad():
        for p in mixer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return mixer


def inputs(seed=1, batch=2):
    torch.manual_seed(seed)
    return torch.randn(batch, HW[0] * HW[1], DIM, dtype=torch.float64)


# ------------------------------------------------------------ naive definitions
def naive_rope(x, hw, base=10000.0):
    """Each token's pairs (2m, 2m+1) turned by row * theta_m (first C/4 pairs) or
    column * theta_(m - C/4), one token and one pair at a time."""
    out = x.clone()
    c = x.shape[-1]
    k_max = c // 4
    for n in range(x.shape[1]):
        r, s = divmod(n, hw[1])
        for m in range(c // 2):
            pos, k = (r, m) if m < k_max else (s, m - k_max)
            phi = pos * base ** (-k / k_max)
            a, b = x[:, n, 2 * m], x[:, n, 2 * m + 1]
            out[:, n, 2 * m] = a * math.cos(phi) - b * math.sin(phi)
            out[:, n, 2 * m + 1] = a * math.sin(phi) + b * math.cos(phi)
    return out


def naive_depthwise(x, weight, bias, hw):
    """out[i, c] = bias[c] + sum over the 3x3 neighbours j inside the grid of
    weight[c, a, b] x[j, c]."""
    h, w = hw
    out = torch.zeros_like(x) + bias
    for n in range(h * w):
        r, s = divmod(n, w)
        for a, b in itertools.product(range(3), range(3)):
            rr, ss = r + a - 1, s + b - 1
            if 0 <= rr < h and 0 <= ss < w:
                out[:, n] += weight[:, 0, a, b] * x[:, rr * w + ss]
    return out


def naive_qkvg(mixer, u, hw):
    """The per-token projections of the module docstring: the positive features
    q = elu(u W_q) + 1 and k, their rotated q_r and k_r, the values v and the gated
    values g (each (batch, n, width))."""
    qk_dim = mixer.qk_dim
    qk = u @ mixer.qk.weight.T + mixer.qk.bias
    q, k = F.elu(qk[..., :qk_dim]) + 1, F.elu(qk[..., qk_dim:]) + 1
    v = u @ mixer.v.weight.T + mixer.v.bias if mixer.v is not None else u
    q_r, k_r = (naive_rope(q, hw), naive_rope(k, hw)) if mixer.rope else (q, k)
    g = v
    if mixer.delta_proj is not None:
        w1, w2 = mixer.delta_proj[0].weight, mixer.delta_proj[1]
        g = v * F.softplus(u @ w1.T @ w2.weight.T + w2.bias)
    return q, k, q_r, k_r, v, g


def naive_output(mixer, y, v, hw):
    """The mixed tokens y plus the D shortcut and the LePE branch on the values."""
    if mixer.D is not None:
        y = y + mixer.D * v
    if mixer.lepe is not None:
        y = y + naive_depthwise(v, mixer.lepe.weight, mixer.lepe.bias, hw)
    return y


def naive_mixer(mixer, u, hw):
    """The module docstring's equations, token by token, head by head."""
    d, e, n = mixer.qk_dim // mixer.num_heads, mixer.dim // mixer.num_heads, u.shape[1]
    q, k, q_r, k_r, v, g = naive_qkvg(mixer, u, hw)
    y = torch.zeros_like(v)
    for b in range(u.shape[0]):
        for h in range(mixer.num_heads):
            sl, sv = slice(h * d, (h + 1) * d), slice(h * e, (h + 1) * e)
            for i in range(n):
                num, den = torch.zeros(e, dtype=u.dtype), 0.0
                for j in range(n):
                    num = num + (q_r[b, i, sl] @ k_r[b, j, sl]) * g[b, j, sv]
                    den = den + q[b, i, sl] @ k[b, j, sl]
                y[b, i, sv] = num / (den + n * mixer.eps) if mixer.normalize else num / n
    return naive_output(mixer, y, v, hw)


def naive_forget_gate(mixer, u, hw):
    """The recurrence: per head, S_t = diag(a_t) S_(t-1) + K_r,t^T G_t and
    Z_t = a_t (.) Z_(t-1) + K_t, y_t = Q_r,t S_t / (Q_t . Z_t + N eps), with
    a_t = exp(-exp(A_log) softplus(u_t W_dt + dt_bias)): one scalar per head
    ('head') or one per key channel ('channel')."""
    d, e, n = mixer.qk_dim // mixer.num_heads, mixer.dim // mixer.num_heads, u.shape[1]
    q, k, q_r, k_r, v, g = naive_qkvg(mixer, u, hw)
    dt = F.softplus(u @ mixer.dt_proj.weight.T + mixer.dt_bias)
    decay = torch.exp(-torch.exp(mixer.A_log) * dt)  # (batch, n, heads or qk_dim)
    per_channel = mixer.forget_gate == 'channel'
    y = torch.zeros_like(v)
    for b in range(u.shape[0]):
        for h in range(mixer.num_heads):
            sl, sv = slice(h * d, (h + 1) * d), slice(h * e, (h + 1) * e)
            S = torch.zeros(d, e, dtype=u.dtype)
            Z = torch.zeros(d, dtype=u.dtype)
            for t in range(n):
                a = decay[b, t, sl] if per_channel else decay[b, t, h]
                S = (a[:, None] if per_channel else a) * S + torch.outer(k_r[b, t, sl],
                                                                         g[b, t, sv])
                Z = a * Z + k[b, t, sl]
                num = q_r[b, t, sl] @ S
                y[b, t, sv] = num / (q[b, t, sl] @ Z + n * mixer.eps) \
                    if mixer.normalize else num / n
    return naive_output(mixer, y, v, hw)


# ---------------------------------------------------------------------- tests
CONFIGS = [dict(), dict(value_proj=True), dict(rope=True), dict(lepe=True),
           dict(normalize=False), dict(input_gate=True), dict(shortcut=True),
           dict(rope=True, lepe=True), dict(num_heads=1, rope=True, lepe=True),
           dict(num_heads=1, qk_dim=4, value_proj=True, rope=True),
           dict(qk_dim=12, lepe=True),
           dict(value_proj=True, rope=True, lepe=True, input_gate=True,
                shortcut=True, normalize=False)]


def config_id(cfg):
    return '+'.join(f'{k}={v}' if not isinstance(v, bool) or not v else k
                    for k, v in cfg.items()) or 'plain'


@pytest.mark.parametrize('cfg', CONFIGS, ids=config_id)
def test_each_switch_matches_the_naive_definition(cfg):
    mixer = perturbed(**cfg)
    u = inputs()
    torch.testing.assert_close(mixer(u, HW), naive_mixer(mixer, u, HW),
                               rtol=1e-10, atol=1e-10)


FORGET = [dict(forget_gate=True), dict(forget_gate=True, rope=True, lepe=True),
          dict(forget_gate=True, normalize=False, input_gate=True, shortcut=True),
          dict(forget_gate=True, num_heads=1, value_proj=True),
          dict(forget_gate=True, num_heads=1, qk_dim=4, rope=True),
          dict(forget_gate='channel'), dict(forget_gate='channel', rope=True, lepe=True),
          dict(forget_gate='channel', normalize=False, num_heads=1, qk_dim=4)]


@pytest.mark.parametrize('cfg', FORGET, ids=config_id)
def test_forget_gate_is_the_recurrence(cfg):
    """The chunked computation (several chunks, a partial last one) equals the
    explicit recurrence, per head and per channel."""
    torch.manual_seed(3)
    mixer = perturbed(**cfg)
    u = torch.randn(2, 150, DIM, dtype=torch.float64)  # 150 tokens: 3 chunks of 64
    hw = (10, 15)
    torch.testing.assert_close(mixer(u, hw), naive_forget_gate(mixer, u, hw),
                               rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('form', [True, 'channel'])
def test_forget_gate_is_causal(form):
    mixer = perturbed(forget_gate=form)
    u = inputs()
    changed = u.clone()
    changed[:, 7:] += 1.0
    a, b = mixer(u, HW), mixer(changed, HW)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_forget_gate_forms_and_their_parameters():
    """'head' (True) decays one scalar per head, 'channel' one per key channel."""
    head, channel = perturbed(forget_gate=True), perturbed(forget_gate='channel',
                                                           qk_dim=4)
    assert head.forget_gate == 'head' and head.A_log.shape == head.dt_bias.shape == (2, )
    assert channel.dt_proj.weight.shape == (4, DIM) and channel.A_log.shape == (4, )
    with pytest.raises(ValueError, match="unknown forget_gate 'state'"):
        LinearAttentionMixer(DIM, HEADS, forget_gate='state')


TWIN = CONFIGS + FORGET


@pytest.mark.parametrize('cfg', TWIN, ids=config_id)
def test_fast_path_equals_its_slow_twin(cfg):
    """attn_backend 'auto' (the associative form or the chunks, RoPE from the
    grid's per-head table) against 'ref' (the mixing matrix or the recurrence,
    RoPE per tensor): output and every gradient."""
    mixer = perturbed(**cfg)
    twin = perturbed(attn_backend='ref', **cfg)
    u = inputs().requires_grad_(True)
    hw = HW
    fast, slow = mixer(u, hw), twin(u, hw)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)
    w = torch.randn_like(fast)
    params = [u, *mixer.parameters()]
    for a, b in zip(torch.autograd.grad((fast * w).sum(), params),
                    torch.autograd.grad((slow * w).sum(), [u, *twin.parameters()])):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_switches_change_the_output_and_the_parameters():
    """Every switch is live: it adds its parameters and changes the function."""
    u = inputs()
    base = perturbed()
    names = dict(value_proj={'v.weight', 'v.bias'}, rope=set(),
                 lepe={'lepe.weight', 'lepe.bias'},
                 input_gate={'delta_proj.0.weight', 'delta_proj.1.weight',
                             'delta_proj.1.bias'},
                 forget_gate={'dt_proj.weight', 'dt_bias', 'A_log'}, shortcut={'D'})
    for switch in SWITCHES:
        mixer = perturbed(**{switch: True})
        extra = {n for n, _ in mixer.named_parameters()} - \
            {n for n, _ in base.named_parameters()}
        assert extra == names[switch], switch
        assert not torch.allclose(mixer(u, HW), base(u, HW)), switch


def test_input_gate_starts_open():
    """At initialisation Delta = 1: the gated mixer computes the ungated one."""
    torch.manual_seed(0)
    gated = LinearAttentionMixer(DIM, HEADS, input_gate=True).double()
    torch.manual_seed(0)
    plain = LinearAttentionMixer(DIM, HEADS).double()
    u = inputs()
    torch.testing.assert_close(gated(u, HW), plain(u, HW))


@pytest.mark.parametrize('cfg', CONFIGS + FORGET, ids=config_id)
def test_mixing_matrices_reproduce_the_output(cfg):
    """'attention' M G = the attention term; 'whole' M^(c) V_c + b_lepe = the
    output; all to 1e-6 in float64 (in practice ~1e-15)."""
    mixer = perturbed(**cfg)
    u = inputs()
    info = mixer.mixing_info()
    assert isinstance(mixer, TokenMixer) and info.kind == 'mlla' and info.grid
    mats, vals = mixer.mixing_matrices(u, HW), mixer.mixing_values(u, HW)
    assert tuple(mats) == info.keys == tuple(vals)
    out = mixer(u, HW)
    heads = mixer.num_heads
    d = mixer.qk_dim // heads
    attn = torch.einsum('bhij,bhjd->bhid', mats['attention'], vals['attention'])
    assert mats['attention'].shape == (2, heads, 12, 12)
    local = torch.zeros_like(out)
    if 'whole' in vals:
        v = vals['whole'][..., 0].transpose(1, 2)
        if mixer.D is not None:
            local = local + mixer.D * v
        if mixer.lepe is not None:
            local = local + grid_conv(mixer.lepe, v, HW)
    torch.testing.assert_close(attn.transpose(1, 2).reshape(2, 12, DIM), out - local,
                               rtol=0, atol=1e-6)
    assert ('whole' in info.keys) == any(
        cfg.get(k) for k in ('lepe', 'shortcut', 'input_gate'))
    if 'whole' in info.keys:
        whole = mats['whole']
        assert whole.shape == (2, DIM, 12, 12) and vals['whole'].shape == (2, DIM, 12, 1)
        bias = mixer.lepe.bias if mixer.lepe is not None else torch.zeros(DIM)
        y = (whole @ vals['whole'])[..., 0].transpose(1, 2) + bias
        torch.testing.assert_close(y, out, rtol=0, atol=1e-6)
    assert info.causal == bool(cfg.get('forget_gate'))
    assert info.d_qk == d and info.local_kernel == (3 if cfg.get('lepe') else 0)


def test_rope_2d_matches_its_definition_and_keeps_norms():
    torch.manual_seed(0)
    x = torch.randn(2, 15, 12, dtype=torch.float64)
    out = rope_2d(x, (3, 5))
    torch.testing.assert_close(out, naive_rope(x, (3, 5)))
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))  # a rotation
    assert rope_2d(x.float(), (3, 5)).dtype == torch.float32
    assert rope_2d(x.bfloat16(), (3, 5)).dtype == torch.float32
    # relative: <R_i q, R_j k> depends on positions only through their offset
    q, k = torch.randn(1, 1, 12, dtype=torch.float64), torch.randn(1, 1, 12,
                                                                    dtype=torch.float64)
    grid = (4, 4)

    def rotated(t, n):
        seq = torch.zeros(1, 16, 12, dtype=torch.float64)
        seq[:, n] = t[:, 0]
        return rope_2d(seq, grid)[:, n]
    assert torch.allclose((rotated(q, 5) * rotated(k, 0)).sum(),
                          (rotated(q, 15) * rotated(k, 10)).sum())
    with pytest.raises(ValueError, match='multiple of 4'):
        rope_2d(torch.randn(1, 4, 6), (2, 2))
    with pytest.raises(ValueError, match='do not fill the grid'):
        rope_2d(torch.randn(1, 5, 8), (2, 2))


def test_depthwise_conv_matrix_is_the_convolution():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False).double()
    x = torch.randn(1, 20, 4, dtype=torch.float64)
    P = depthwise_conv_matrix(conv.weight, (4, 5))
    via_matrix = torch.einsum('cij,bjc->bic', P, x)
    torch.testing.assert_close(via_matrix, grid_conv(conv, x, (4, 5)))
    torch.testing.assert_close(via_matrix, naive_depthwise(x, conv.weight,
                                                           torch.zeros(4), (4, 5)))
    # every entry lies within w + 1 raster positions of the diagonal
    i, j = torch.nonzero(P.abs().sum(0)).T
    assert (i - j).abs().max() == 5 + 1


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match='must divide dim'):
        LinearAttentionMixer(10, 3)
    with pytest.raises(ValueError, match=r'divide dim \(8\) and qk_dim \(6\)'):
        LinearAttentionMixer(8, 4, qk_dim=6)
    with pytest.raises(ValueError, match='multiple of 4'):
        LinearAttentionMixer(6, 1, rope=True)
    with pytest.raises(ValueError, match=r'qk_dim \(6\) to be a multiple of 4'):
        LinearAttentionMixer(8, 1, qk_dim=6, rope=True)
    with pytest.raises(ValueError, match='unknown attn_backend'):
        LinearAttentionMixer(DIM, HEADS, forget_gate=True, attn_backend='cuda')
    mixer = LinearAttentionMixer(DIM, HEADS)
    with pytest.raises(ValueError, match='do not fill the grid'):
        mixer(torch.randn(1, 12, DIM), (3, 5))
    with pytest.raises(ValueError, match=r'input must have shape \(batch, H \* W, 8\)'):
        mixer(torch.randn(1, 12, 4), (3, 4))


def test_mixing_info_is_one_contract():
    assert LinearAttentionMixer(DIM, HEADS).mixing_info() == MixerInfo(
        'mlla', HEADS, 4, ('attention', ), grid=True)
    assert LinearAttentionMixer(DIM, HEADS, lepe=True).mixing_info().keys == (
        'attention', 'whole')


def test_single_head_of_a_narrow_width():
    """Mamba's single head: one Q and one K of qk_dim channels for every value
    channel; the projection shrinks to 2 qk_dim outputs and the rank bound is
    qk_dim."""
    mixer = perturbed(num_heads=1, qk_dim=4, value_proj=True)
    assert mixer.qk.weight.shape == (8, DIM)
    assert mixer.mixing_info().d_qk == 4 and mixer.mixing_info().nheads == 1
    A = mixer.mixing_matrices(inputs(), HW)['attention']
    assert torch.linalg.matrix_rank(A[0, 0]) == 4
