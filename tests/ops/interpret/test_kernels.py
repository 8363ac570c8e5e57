"""The Triton kernels' arithmetic on the CPU, through Triton's interpreter.

The chunk scan forward and backward (both directions), the fused mixer core, the
conv, the gated norm and the add + norm, against float64 references; the ways of
splitting the work (channel blocks and segments of the forward, the backward's
chunk size) against each other. Bounds: :mod:`.checks`.
"""
import pytest
import torch

from mmdinomamba.models.mixers import SSDMixer
from mmdinomamba.ops import rms_norm, ssd_ref
from mmdinomamba.ops.triton import add_rms_norm_triton, mixer_core_triton, ssd_triton
from mmdinomamba.ops.triton.conv import (BWD_BLOCK_T, FWD_BLOCK_T, conv_backward,
                                         conv_forward)
from mmdinomamba.ops.triton.ssd_bwd import scan_backward
from mmdinomamba.ops.triton.ssd_common import ScanArgs
from mmdinomamba.ops.triton.ssd_fwd import scan_forward
from .checks import HALF_TOL, TOL, assert_close_all, bits, rel


def test_scan_one_direction():
    """Several chunks (5 forward, 3 backward with a short last one), two groups,
    per-channel D, gate z, dt bias and softplus: output and every gradient."""
    torch.manual_seed(0)
    L = 150
    x = torch.randn(2, L, 4, 16, requires_grad=True)
    dt = (torch.randn(2, L, 4) * 0.5 - 1).requires_grad_()
    A = (-torch.rand(4) * 3 - 0.5).requires_grad_()
    B = torch.randn(2, L, 2, 16, requires_grad=True)
    C = torch.randn(2, L, 2, 16, requires_grad=True)
    D = torch.randn(4, 16, requires_grad=True)
    bias = torch.randn(4, requires_grad=True)
    z = torch.randn(2, L, 4, 16, requires_grad=True)
    ins = [x, dt, A, B, C, D, bias, z]
    y_ref = ssd_ref(*[t.double() for t in ins[:5]], D=D.double(), z=z.double(),
                    dt_bias=bias.double(), dt_softplus=True)
    dy = torch.randn_like(y_ref)
    g_ref = torch.autograd.grad(y_ref, ins, dy)
    y = ssd_triton(x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True)
    g = torch.autograd.grad(y, ins, dy.float())
    errors = {'y': rel(y, y_ref)}
    for name, a, b in zip('x dt A B C D dt_bias z'.split(), g, g_ref):
        errors['d' + name] = rel(a, b)
    assert_close_all(errors)


@pytest.mark.parametrize('conv_bias', [True, False], ids=['conv-bias', 'no-conv-bias'])
def test_bidirectional_mixer_core(conv_bias):
    """The fused core against the reference path of the same module (float64),
    every gradient; the forward without autograd gives the same bits."""
    torch.manual_seed(0)
    mixer = SSDMixer(32, d_state=16, headdim=16, chunk_size=16, bias=True,
                     conv_bias=conv_bias).double()
    with torch.no_grad():
        for name, p in mixer.named_parameters():
            if 'norm' in name or name.startswith('D'):
                p.add_(torch.randn_like(p) * 0.3)
    u = torch.randn(2, 21, 32, dtype=torch.float64, requires_grad=True)
    params = [u] + list(mixer.parameters())
    y_ref = mixer(u)
    dy = torch.randn_like(y_ref)
    g_ref = torch.autograd.grad(y_ref, params, dy)
    mixer.float()
    u32 = u.detach().float().requires_grad_()
    y = mixer_core_triton(mixer.in_proj(u32), mixer.core_params(), mixer.spec)
    g = torch.autograd.grad(y, [u32] + list(mixer.parameters()), dy.float())
    errors = {'y': rel(y, y_ref)}
    names = ['u'] + [n for n, _ in mixer.named_parameters()]
    for name, a, b in zip(names, g, g_ref):
        errors['d' + name] = rel(a, b)
    assert {'du', 'dA_log_b', 'dconv1d_b.weight', 'din_proj.weight'} <= set(errors)
    assert_close_all(errors)
    with torch.no_grad():  # the forward alone, outside the autograd function
        y_nograd = mixer_core_triton(mixer.in_proj(u32), mixer.core_params(),
                                     mixer.spec)
    assert torch.equal(y_nograd, y.detach())


def _add_norm_inputs():
    torch.manual_seed(0)
    h = torch.randn(3, 5, 40, requires_grad=True)
    r = torch.randn(3, 5, 40, requires_grad=True)
    w = torch.randn(40, requires_grad=True)
    return h, r, w


@pytest.mark.parametrize('scaled', [False, True], ids=['plain', 'drop-path'])
def test_add_rms_norm(scaled):
    """Residual add + RMSNorm, with a per-sample stochastic-depth factor (one
    sample dropped) or without, against float64: outputs and gradients."""
    h, r, w = _add_norm_inputs()
    sc = torch.tensor([0., 1.25, 0.8]) if scaled else None
    res, out = add_rms_norm_triton(h, r, w, 1e-5, torch.float32, sc)
    scale = sc.double()[:, None, None] if scaled else 1.0
    res_ref = h.double() * scale + r.double()
    out_ref = rms_norm(res_ref, w.double(), 1e-5)
    gr, go = torch.randn_like(res_ref), torch.randn_like(out_ref)
    g = torch.autograd.grad([res, out], [h, r, w], [gr.float(), go.float()])
    g_ref = torch.autograd.grad([res_ref, out_ref], [h, r, w], [gr, go])
    errors = {'res': rel(res, res_ref), 'out': rel(out, out_ref)}
    for name, a, b in zip(['h', 'residual', 'weight'], g, g_ref):
        errors['d' + name] = rel(a, b)
    assert_close_all(errors)
    with torch.no_grad():
        nograd = add_rms_norm_triton(h, r, w, 1e-5, torch.float32, sc)
    assert bits(nograd, (res, out)) == 0.0


def test_add_rms_norm_float16_output():
    """A float16 output (autocast): the stream stays float32, and the backward
    reads the normalised rows kept in float16 (no float32 row of the residual)."""
    h, r, w = _add_norm_inputs()
    sc = torch.tensor([0., 1.25, 0.8])
    kept = []

    def keep(t):
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        res, out = add_rms_norm_triton(h, r, w, 1e-5, torch.float16, sc)
    res_ref = h.double() * sc.double()[:, None, None] + r.double()
    out_ref = rms_norm(res_ref, w.double(), 1e-5)
    gr, go16 = torch.randn_like(res_ref), torch.randn_like(out_ref).half()
    g = torch.autograd.grad([res, out], [h, r, w], [gr.float(), go16])
    g_ref = torch.autograd.grad([res_ref, out_ref], [h, r, w], [gr, go16.double()])
    assert rel(res, res_ref) < TOL
    assert not any(t.dtype == torch.float32 and t.numel() == h.numel() for t in kept)
    errors = {'out': rel(out, out_ref)}
    for name, a, b in zip(['h', 'residual', 'weight'], g, g_ref):
        errors['d' + name] = rel(a, b)
    assert_close_all(errors, HALF_TOL)


def test_conv_both_directions():
    """Both directions' conv + SiLU over several token blocks, against torch's
    conv1d: output and gradients."""
    torch.manual_seed(0)
    L = 2 * max(FWD_BLOCK_T, BWD_BLOCK_T) + 22
    xc = torch.randn(2, L, 24, requires_grad=True)
    wc = torch.randn(2, 24, 4, requires_grad=True)
    bc = torch.randn(2, 24, requires_grad=True)

    def conv_ref(x, w, b):
        f = torch.nn.functional
        y0 = f.conv1d(x.transpose(1, 2), w[0][:, None], b[0], padding=3,
                      groups=24)[..., :L]
        y1 = f.conv1d(x.flip(1).transpose(1, 2), w[1][:, None], b[1], padding=3,
                      groups=24)[..., :L].flip(-1)
        return f.silu(torch.stack([y0, y1], 1).permute(0, 3, 1, 2))

    ref = conv_ref(xc.double(), wc.double(), bc.double())
    gout = torch.randn_like(ref)
    g_ref = torch.autograd.grad(ref, [xc, wc, bc], gout)
    out = conv_forward(xc.detach(), wc.detach(), bc.detach(), torch.empty(2, L, 2, 24))
    dxc = torch.empty(2, L, 24)
    dw, db = conv_backward(xc.detach(), wc.detach(), bc.detach(), gout.float(), dxc)
    errors = {'out': rel(out, ref)}
    for name, a, b in zip(['x', 'w', 'b'], [dxc, dw, db], g_ref):
        errors['d' + name] = rel(a, b)
    assert_close_all(errors)


def _scan_inputs():
    """70 tokens, 2 directions, 4 heads of 16, one group of state 16."""
    torch.manual_seed(0)
    xbc = torch.randn(1, 70, 2, 4 * 16 + 2 * 16)
    raw = torch.randn(1, 70, 4) - 1
    bias8, A8, D8 = torch.randn(8), -torch.rand(8) * 4, torch.randn(8, 16)
    return xbc, raw, bias8, A8, D8


def _views(xbc):
    return (xbc[..., :64].view(1, 70, 2, 4, 16), xbc[..., 64:80].view(1, 70, 2, 1, 16),
            xbc[..., 80:].view(1, 70, 2, 1, 16))


@pytest.mark.parametrize('headdim,blocks,chunk', [(32, 2, 16), (64, 4, 32)])
def test_forward_channel_blocks_and_segments(headdim, blocks, chunk):
    """The forward scan in channel blocks (two of 32-wide heads with chunk 16,
    four of 64-wide heads with chunk 32) equals the one-block scan; with chunk
    16 the sequence cut into segments (5 chunks: 2 segments of 3 and 2 chunks, 3
    of 2, 2, 1, one per chunk) too."""
    xbc, raw, bias8, A8, _ = _scan_inputs()
    _, B, C = _views(xbc)
    xp = torch.randn(1, 70, 2, 4, headdim)
    args = ScanArgs(xp, B, C, raw, bias8, A8, torch.randn(8, headdim), True, chunk)
    one, split = [scan_forward(args, torch.empty_like(xp), p_blocks=n)
                  for n in (1, blocks)]
    errors = {f'pblocks{blocks}': rel(split, one)}
    if chunk == 16:
        for segments in (2, 3, 5):
            errors[f'segments{segments}'] = rel(
                scan_forward(args, torch.empty_like(xp), p_blocks=blocks,
                             segments=segments), one)
    assert_close_all(errors)


def test_backward_chunk_sizes_agree():
    """The backward with chunk 32 (the last 6 of 70 tokens a separate launch with
    a 16-token tile) equals the one with chunk 16, every gradient."""
    xbc, raw, bias8, A8, D8 = _scan_inputs()
    dy = torch.randn(1, 70, 2, 4, 16)
    outs = []
    for chunk in (16, 32):
        dx = torch.empty(1, 70, 2, 4, 16)
        args = ScanArgs(*_views(xbc), raw, bias8, A8, D8, True, chunk)
        outs.append([dx, *scan_backward(args, dy, dx)])
    assert_close_all({name: rel(a, b) for name, a, b in
                      zip('dx dB dC ddt dA dbias dD'.split(), outs[1], outs[0])})


def test_mixer_layout_a_log_and_per_head_d():
    """A_log and a per-head D read by the kernels as they are equal A = -exp(A_log)
    and D expanded over the channels: forward (cut in segments too, so that the
    segment-state kernel reads A_log) and backward (whose dA is then A_log's
    gradient)."""
    xbc, raw, bias8, _, _ = _scan_inputs()
    Alog8, Dh8 = torch.randn(8) * 0.5, torch.randn(8)

    def layout_args(chunk, log):
        A, D = Alog8, Dh8
        if not log:
            A, D = -Alog8.exp(), Dh8[:, None].expand(8, 16).contiguous()
        return ScanArgs(*_views(xbc), raw, bias8, A, D, True, chunk, a_log=log)

    errors = {}
    y_lin = scan_forward(layout_args(16, False), torch.empty(1, 70, 2, 4, 16),
                         segments=1)
    for segments in (1, 2):
        y_log = scan_forward(layout_args(16, True), torch.empty(1, 70, 2, 4, 16),
                             segments=segments)
        errors[f'segments{segments}.y'] = rel(y_log, y_lin)
    dy = torch.randn(1, 70, 2, 4, 16)
    outs = []
    for log in (True, False):
        dx = torch.empty(1, 70, 2, 4, 16)
        outs.append([dx, *scan_backward(layout_args(32, log), dy, dx,
                                        dD_per_slot=True)])
    outs[1][4] = outs[1][4] * -Alog8.exp()  # dA_log = dA * A
    for name, a, b in zip('dx dB dC ddt dA_log dbias dD'.split(), outs[0], outs[1]):
        errors[name] = rel(a, b)
    assert_close_all(errors)


@pytest.mark.parametrize('segmented', [False, True], ids=['one-segment', 'segments'])
def test_extreme_steps_stay_finite(segmented, monkeypatch):
    """float32's exp range: one token with dt * |A| = 1e5 among small steps in head
    0; in head 1 a run of dt = 1e36 (A = -16), whose log-decays summed over a
    chunk leave float32's range (-inf - -inf was NaN). The recurrence in float64
    is finite and is the truth. Segmented: 2 segments of the 3 chunks, as
    default_segments cuts them when chunks may be segments (the carried state
    crosses the 1e36 steps)."""
    from mmdinomamba.ops.triton import ssd_fwd
    if segmented:
        monkeypatch.setattr(ssd_fwd, 'FWD_MIN_SEGMENT_CHUNKS', 1)
    torch.manual_seed(0)
    xe, Be, Ce = (torch.randn(1, 80, 2, 16), torch.randn(1, 80, 1, 16),
                  torch.randn(1, 80, 1, 16))
    dte = torch.rand(1, 80, 2) * 0.1
    dte[0, 10, 0] = 1e5 / 4
    dte[0, 40:80, 1] = 1e36
    Ae = torch.tensor([-4., -16.])
    ye = ssd_triton(xe, dte, Ae, Be, Ce)
    ye_ref = ssd_ref(xe.double(), dte.double(), Ae.double(), Be.double(), Ce.double())
    assert bool(ye.isfinite().all())
    assert rel(ye, ye_ref) < TOL
