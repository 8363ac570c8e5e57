"""The SSD backends against the token-by-token recurrence.

Words -> paper letters: seqlen = L, nheads = H, headdim = P, ngroups = G,
dstate = N, chunk = Q.
"""
import itertools

import pytest
import torch

from mmdinomamba.ops import (BACKENDS, resolve_backend, segsum, ssd_chunked, ssd_scan,
                             ssd_mixing_matrix, ssd_quadratic, ssd_ref)

CHUNK = 8
# float64: agreement to round-off (a few hundred ulps over sums of ~L*N terms);
# float32: 1e-4 relative as required by the issue.
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-11),
       torch.float32: dict(rtol=1e-4, atol=1e-5)}


def make_inputs(batch=2, seqlen=13, nheads=4, headdim=3, ngroups=2, dstate=5,
                dtype=torch.float64, seed=0, with_D=True, D_per_channel=False,
                with_z=False, with_bias=False, with_h0=False):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    args = dict(
        x=randn(batch, seqlen, nheads, headdim),
        dt=randn(batch, seqlen, nheads) * 0.5,
        A=-(torch.rand(nheads, generator=g, dtype=dtype) * 2 + 0.1),
        B=randn(batch, seqlen, ngroups, dstate),
        C=randn(batch, seqlen, ngroups, dstate))
    kwargs = {}
    if with_D:
        kwargs['D'] = randn(nheads, headdim) if D_per_channel else randn(nheads)
    if with_z:
        kwargs['z'] = randn(batch, seqlen, nheads, headdim)
    if with_bias:
        kwargs['dt_bias'] = randn(nheads)
    if with_h0:
        kwargs['initial_states'] = randn(batch, nheads, headdim, dstate)
    # the raw recurrence needs dt > 0: softplus it unless the op will
    kwargs['dt_softplus'] = True
    return args, kwargs


SEQLENS = [1, 7, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 2]
OPTIONS = list(itertools.product([False, True], repeat=4))  # D, z, bias, h0


@pytest.mark.parametrize('seqlen', SEQLENS)
@pytest.mark.parametrize('with_D,with_z,with_bias,with_h0', OPTIONS)
@pytest.mark.parametrize('ngroups', [1, 2])
def test_chunked_equals_recurrence_float64(seqlen, with_D, with_z, with_bias,
                                           with_h0, ngroups):
    args, kwargs = make_inputs(seqlen=seqlen, ngroups=ngroups, with_D=with_D,
                               with_z=with_z, with_bias=with_bias, with_h0=with_h0)
    y_ref, h_ref = ssd_ref(**args, **kwargs, return_final_states=True)
    y, h = ssd_chunked(**args, **kwargs, chunk_size=CHUNK, return_final_states=True)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float64])
    torch.testing.assert_close(h, h_ref, **TOL[torch.float64])


@pytest.mark.parametrize('seqlen', SEQLENS)
def test_chunked_equals_recurrence_float32(seqlen):
    args, kwargs = make_inputs(seqlen=seqlen, dtype=torch.float32, with_z=True,
                               with_bias=True, with_h0=True)
    y_ref, h_ref = ssd_ref(**args, **kwargs, return_final_states=True)
    y, h = ssd_chunked(**args, **kwargs, chunk_size=CHUNK, return_final_states=True)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, y_ref, **TOL[torch.float32])
    torch.testing.assert_close(h, h_ref, **TOL[torch.float32])


def test_dt_softplus_off_uses_dt_as_given():
    args, kwargs = make_inputs(seqlen=10)
    kwargs['dt_softplus'] = False
    args['dt'] = args['dt'].abs() + 0.01  # the recurrence's step must be positive
    torch.testing.assert_close(ssd_chunked(**args, **kwargs, chunk_size=4),
                               ssd_ref(**args, **kwargs), **TOL[torch.float64])


def test_per_channel_D():
    args, kwargs = make_inputs(seqlen=9, D_per_channel=True)
    torch.testing.assert_close(ssd_chunked(**args, **kwargs, chunk_size=4),
                               ssd_ref(**args, **kwargs), **TOL[torch.float64])


def test_recurrence_matches_hand_computation():
    """One head, one channel, dstate 1: the recurrence written out by hand."""
    x = torch.tensor([1.0, 2.0, -1.0], dtype=torch.float64).view(1, 3, 1, 1)
    dt = torch.tensor([0.5, 0.25, 1.0], dtype=torch.float64).view(1, 3, 1)
    A = torch.tensor([-2.0], dtype=torch.float64)
    B = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64).view(1, 3, 1, 1)
    C = torch.tensor([3.0, 1.0, 0.5], dtype=torch.float64).view(1, 3, 1, 1)
    D = torch.tensor([0.1], dtype=torch.float64)
    h, expected = 0.0, []
    for t in range(3):
        h = torch.exp(dt[0, t, 0] * A[0]) * h + dt[0, t, 0] * B[0, t, 0, 0] * x[0, t, 0, 0]
        expected.append(C[0, t, 0, 0] * h + D[0] * x[0, t, 0, 0])
    y = ssd_ref(x, dt, A, B, C, D=D)
    torch.testing.assert_close(y.flatten(), torch.stack(expected), rtol=0, atol=1e-15)


@pytest.mark.parametrize('seqlen', [1, 5, 12])
def test_quadratic_and_mixing_matrix(seqlen):
    args, kwargs = make_inputs(seqlen=seqlen, with_z=True, with_bias=True)
    y_ref = ssd_ref(**args, **kwargs)
    torch.testing.assert_close(ssd_quadratic(**args, **kwargs), y_ref,
                               **TOL[torch.float64])
    # y = M x per head with M from ssd_mixing_matrix (no gate: z acts after mixing)
    kwargs.pop('z')
    M = ssd_mixing_matrix(args['dt'], args['A'], args['B'], args['C'], D=kwargs['D'],
                          dt_bias=kwargs['dt_bias'], dt_softplus=True)
    assert M.shape == (2, 4, seqlen, seqlen)
    assert torch.all(M.triu(1) == 0), 'SSD mixing is causal'
    y = torch.einsum('bhij,bjhp->bihp', M, args['x'])
    torch.testing.assert_close(y, ssd_ref(**args, **kwargs), **TOL[torch.float64])


def test_segsum_against_loop():
    a = torch.randn(2, 6, dtype=torch.float64)
    out = segsum(a)
    for i in range(6):
        for j in range(6):
            want = a[:, j + 1:i + 1].sum(-1) if i >= j else torch.full((2, ), -torch.inf,
                                                                       dtype=a.dtype)
            torch.testing.assert_close(out[:, i, j], want, rtol=0, atol=1e-14)


@pytest.mark.parametrize('seqlen', [3, CHUNK + 2])
def test_gradients_gradcheck(seqlen):
    args, kwargs = make_inputs(batch=1, seqlen=seqlen, nheads=2, headdim=2,
                               ngroups=1, dstate=2, with_z=True, with_bias=True,
                               with_h0=True)
    names = list(args) + ['D', 'z', 'dt_bias', 'initial_states']
    tensors = [t.clone().requires_grad_() for t in
               list(args.values()) + [kwargs[n] for n in names[5:]]]

    def fn(*ts):
        a = dict(zip(names, ts))
        return ssd_chunked(a['x'], a['dt'], a['A'], a['B'], a['C'], chunk_size=4,
                           D=a['D'], z=a['z'], dt_bias=a['dt_bias'], dt_softplus=True,
                           initial_states=a['initial_states'],
                           return_final_states=True)

    assert torch.autograd.gradcheck(fn, tensors, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradients_match_recurrence():
    args, kwargs = make_inputs(seqlen=11, with_z=True, with_bias=True)
    grads = []
    for fn in (ssd_ref, ssd_chunked):
        leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
        y = fn(**leaves, **kwargs, chunk_size=4) if fn is ssd_chunked else fn(
            **leaves, **kwargs)
        y.square().sum().backward()
        grads.append([leaves[k].grad for k in args])
    for g_ref, g in zip(*grads):
        torch.testing.assert_close(g, g_ref, **TOL[torch.float64])


@pytest.mark.parametrize('backend', ['chunked', 'quadratic', 'ref', 'auto'])
def test_dispatch(backend):
    args, kwargs = make_inputs(seqlen=6)
    y = ssd_scan(**args, **kwargs, chunk_size=4, backend=backend)
    torch.testing.assert_close(y, ssd_ref(**args, **kwargs), **TOL[torch.float64])


def test_quadratic_warns_once_when_its_matrices_are_large(monkeypatch):
    """'quadratic' holds a seqlen x seqlen matrix per head: above a size it warns,
    once, naming the memory (batch x heads x seqlen^2 x bytes) and 'chunked'; below
    it, or for another backend, it says nothing. The result is the same."""
    import warnings

    import mmdinomamba.ops.backend as backend
    args, kwargs = make_inputs(seqlen=13)  # batch 2, 4 heads, float64: 10816 bytes
    monkeypatch.setattr(backend, '_QUADRATIC_WARNED', [False])
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the default limit (1 GiB): no warning
        ssd_scan(**args, **kwargs, backend='quadratic')
        monkeypatch.setattr(backend, 'QUADRATIC_WARN_BYTES', 10816 - 1)
        ssd_scan(**args, **kwargs, backend='chunked')
    with pytest.warns(UserWarning) as caught:
        y = ssd_scan(**args, **kwargs, backend='quadratic')
        ssd_scan(**args, **kwargs, backend='quadratic')  # once per process
    (warning, ) = caught
    message = str(warning.message)
    assert "backend 'quadratic'" in message and "backend 'chunked'" in message
    assert '0.00 GiB' in message
    assert '(batch 2 x 4 heads x 13^2 tokens x 8 bytes)' in message
    torch.testing.assert_close(y, ssd_ref(**args, **kwargs), **TOL[torch.float64])


def test_backend_choice_is_logged_and_checked(caplog):
    assert resolve_backend('auto', torch.device('cpu')) == 'chunked'
    with pytest.raises(ValueError, match='unknown backend'):
        resolve_backend('fast', torch.device('cpu'))
    with pytest.raises(ValueError, match='mamba_ssm'):
        resolve_backend('mamba_ssm', torch.device('cpu'))
    assert set(BACKENDS) >= {'auto', 'chunked', 'ref', 'mamba_ssm'}


def test_auto_scans_float64_with_the_pytorch_backend_where_triton_is_chosen(monkeypatch):
    """On CUDA 'auto' resolves to 'triton', whose kernels take no float64: float64
    must scan with 'chunked' (Triton is made to look available here; the choice
    reads only the device's type)."""
    import mmdinomamba.ops.backend as backend
    monkeypatch.setattr(backend, 'triton_available', lambda: True)
    cuda = torch.device('cuda')
    assert resolve_backend('auto', cuda, dtype=torch.float32) == 'triton'
    assert resolve_backend('auto', cuda, dtype=torch.float64) == 'chunked'
    args, kwargs = make_inputs(seqlen=6)
    assert args['x'].dtype == torch.float64
    y = ssd_scan(**args, **kwargs, chunk_size=4, backend='auto')
    torch.testing.assert_close(y, ssd_ref(**args, **kwargs), **TOL[torch.float64])


BAD_INPUTS = [
    ('x', lambda a, k: a.update(x=a['x'][0]), 'x'),
    ('dt', lambda a, k: a.update(dt=a['dt'][..., :-1]), 'dt'),
    ('A', lambda a, k: a.update(A=a['A'][None]), 'A'),
    ('B', lambda a, k: a.update(B=a['B'][:, :-1]), 'B'),
    ('C', lambda a, k: a.update(C=a['C'][..., :-1]), 'C'),
    ('ngroups', lambda a, k: a.update(B=a['B'][:, :, :1].expand(-1, -1, 3, -1),
                                      C=a['C'][:, :, :1].expand(-1, -1, 3, -1)),
     'ngroups'),
    ('D', lambda a, k: k.update(D=torch.ones(3)), 'D'),
    ('z', lambda a, k: k.update(z=torch.ones(1)), 'z'),
    ('dt_bias', lambda a, k: k.update(dt_bias=torch.ones(2)), 'dt_bias'),
    ('initial_states', lambda a, k: k.update(initial_states=torch.ones(2, 4, 3)),
     'initial_states'),
    ('nan dt', lambda a, k: a['dt'].__setitem__((0, 0, 0), float('nan')), 'dt'),
    ('inf dt', lambda a, k: a['dt'].__setitem__((0, 1, 0), float('inf')), 'dt'),
]


@pytest.mark.parametrize('what,corrupt,name', BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_names_the_argument(what, corrupt, name):
    args, kwargs = make_inputs(seqlen=6)
    corrupt(args, kwargs)
    with pytest.raises(ValueError, match=name):
        ssd_scan(**args, **kwargs, chunk_size=4)


# -- extreme steps and decays in float32 ------------------------------------------------
# dt * A summed over a chunk can leave float32's range (dt = 1e35, A = -16; or
# A_log >= 89, where A = -exp(A_log) is -inf in float32) while every decay is
# simply 0. The reference is the recurrence in float64 on the same float32
# inputs, where none of these values overflow.
EXTREME_DT = [1e-30, 1e-3, 1.0, 1e5, 1e35]
# the last: A_log = 89, A = -exp(89) = -inf in float32
EXTREME_A = [-1e-6, -1.0, -16.0, -1e4, -torch.exp(torch.tensor(89.0)).item()]


def extreme_inputs(dt_value, A_value, seqlen=2 * CHUNK + 3):
    args, _ = make_inputs(seqlen=seqlen, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    # dt spread over a decade around dt_value, so tokens decay differently
    args['dt'] = dt_value * (1 + 9 * torch.rand(args['dt'].shape, generator=g))
    args['A'] = torch.full_like(args['A'], A_value)
    return args


def assert_close_scaled(got, want, rtol):
    """max |got - want| <= rtol * max |want|: one tolerance for outputs of any scale."""
    assert torch.isfinite(got).all()
    err = (got.double() - want).abs().max() / want.abs().max()
    assert err <= rtol, f'relative error {err:.2e} > {rtol:.0e}'


@pytest.mark.parametrize('A_value', EXTREME_A)
@pytest.mark.parametrize('dt_value', EXTREME_DT)
def test_backends_finite_and_agree_for_extreme_dt_and_A_float32(dt_value, A_value):
    args = extreme_inputs(dt_value, A_value)
    A64 = args['A'].double()  # -inf stays -inf: the float32 parameter as given
    want = ssd_ref(**{k: v.double() for k, v in args.items() if k != 'A'}, A=A64)
    assert torch.isfinite(want).all()
    for fn in (ssd_ref, ssd_chunked, ssd_quadratic):
        # float32 round-off on sums of ~seqlen * dstate terms
        assert_close_scaled(fn(**args, chunk_size=CHUNK), want, rtol=1e-5)


def test_chunked_keeps_precision_after_one_huge_step():
    """One token with dt * |A| = 1e5 then small ones: later decays stay exact.

    exp(cs_end - cs_s) with cs ~ -1e5 loses float32's resolution at 1e5
    (~0.008 absolute, 0.8 % in exp); the segment sums never form that difference.
    """
    args = extreme_inputs(1e-2, -1.0, seqlen=2 * CHUNK)
    args['dt'][:, 2] = 1e5  # dt * |A| = 1e5 at token 2 of chunk 0
    want = ssd_ref(**{k: v.double() for k, v in args.items()})
    # the float32 recurrence's own error on this input is ~3e-7
    assert_close_scaled(ssd_ref(**args), want, rtol=2e-6)
    assert_close_scaled(ssd_chunked(**args, chunk_size=CHUNK), want, rtol=2e-6)


def test_chunked_chunk_states_and_final_state_survive_overflow():
    """The final state (step 3) of a chunk whose summed dt * A is -inf in float32."""
    args = extreme_inputs(1e35, -1e4, seqlen=3 * CHUNK)  # dt * A = -inf per token
    h0 = torch.randn(2, 4, 3, 5)
    y, h = ssd_chunked(**args, chunk_size=CHUNK, initial_states=h0,
                       return_final_states=True)
    want_y, want_h = ssd_ref(**{k: v.double() for k, v in args.items()},
                             initial_states=h0.double(), return_final_states=True)
    assert_close_scaled(y, want_y, rtol=1e-5)
    assert_close_scaled(h, want_h, rtol=1e-5)


def test_quadratic_refuses_sequences_that_would_take_minutes(monkeypatch):
    """'quadratic' above QUADRATIC_MAX_SEQLEN tokens (1024, from
    benchmarks/results/ssd_quadratic_length.csv) fails at once, naming the limit
    and the backend to use (was: 41 s for 4096 tokens of the toy configs); at the
    limit it runs and equals the reference."""
    import mmdinomamba.ops.backend as backend
    assert backend.QUADRATIC_MAX_SEQLEN == 1024
    monkeypatch.setattr(backend, 'QUADRATIC_MAX_SEQLEN', 12)
    args, kwargs = make_inputs(seqlen=12)
    y = ssd_scan(**args, **kwargs, backend='quadratic')
    torch.testing.assert_close(y, ssd_ref(**args, **kwargs), **TOL[torch.float64])
    args, kwargs = make_inputs(seqlen=13)
    with pytest.raises(ValueError, match=r"backend 'quadratic' builds a 13 x 13 mixing "
                       r'matrix per head, and refuses sequences longer than 12 tokens '
                       r".*use ssd_backend='chunked'.*--cfg-options "
                       r'model\.backbone\.mixer_cfg\.ssd_backend=auto'):
        ssd_scan(**args, **kwargs, backend='quadratic')
    ssd_scan(**args, **kwargs, backend='chunked')  # the other backends take it


def test_the_toy_backbone_refuses_a_long_input_at_once():
    """The toy DinoVim (ssd_backend='quadratic') on 264 px: 1089 patches + 2
    readouts > 1024 tokens, refused at the first block instead of computed."""
    import time

    from mmdinomamba.models import DinoVim
    model = DinoVim(arch=dict(embed_dims=16, num_layers=1), img_size=64, patch_size=8,
                    mixer_cfg=dict(d_state=4, headdim=8, ssd_backend='quadratic'))
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"'quadratic' builds a 1091 x 1091"):
        model(torch.randn(1, 3, 264, 264))
    assert time.perf_counter() - start < 5
    assert model(torch.randn(1, 3, 64, 64))[0].shape == (1, 16)
