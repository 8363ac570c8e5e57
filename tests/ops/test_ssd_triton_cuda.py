"""The fused Triton paths against the PyTorch reference, on a CUDA device.

Tolerances (relative L2 error, ``|a - b| / |b|``):

* float32 inputs with TF32 off: the kernels' dots run in IEEE fp32, so the error
  is fp32 rounding over a few hundred terms, far below 1e-4;
* bfloat16 inputs / bf16 autocast: the kernels round their dot operands
  (``x * dt``, the masked ``C B^T`` and the carried state) to bf16, each a
  relative error of at most 2^-9 ~ 2e-3 that adds up over a handful of roundings
  per term; 2e-2 leaves a margin of a few while still catching any wrong term
  (a missing or doubled contribution is an O(1) error).
"""

import pytest
import torch

from mmdinomamba.models.backbones import DinoVim
from mmdinomamba.models.mixers import SSDMixer
from mmdinomamba.ops import add_rms_norm, rms_norm, ssd_chunked
from tests.helpers.reference_data import MAMBAR, VIM, load_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures('no_tf32')]

FP32_TOL = 1e-4
BF16_TOL = 2e-2


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _scan_inputs(batch, seqlen, nheads, headdim, ngroups, dstate, dtype, seed):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    return dict(x=randn(batch, seqlen, nheads, headdim).to(dtype),
                dt=(randn(batch, seqlen, nheads) * 0.5 - 1.0).to(dtype),
                A=-(torch.rand(nheads, generator=g) * 15 + 1),
                B=randn(batch, seqlen, ngroups, dstate).to(dtype),
                C=randn(batch, seqlen, ngroups, dstate).to(dtype),
                D=randn(nheads), dt_bias=randn(nheads) - 3)


@pytest.mark.parametrize('dtype,tol', [(torch.float32, FP32_TOL),
                                       (torch.bfloat16, BF16_TOL)])
@pytest.mark.parametrize('shape', [
    # batch, seqlen, nheads, headdim, ngroups, dstate
    (2, 198, 4, 64, 1, 64),   # a DinoVim-B head at 224 px
    (1, 1026, 2, 64, 1, 64),  # 512 px: many chunks
    (3, 37, 6, 48, 2, 16),    # odd sizes: padded tiles, groups, one chunk
])
def test_ssd_triton_matches_reference(shape, dtype, tol):
    from mmdinomamba.ops.triton import ssd_triton
    inputs = _scan_inputs(*shape, dtype=dtype, seed=sum(shape))
    grads_of = ('x', 'dt', 'A', 'B', 'C', 'D', 'dt_bias')
    ref_in = {k: v.double().requires_grad_(k in grads_of) for k, v in inputs.items()}
    y_ref = ssd_chunked(**ref_in, dt_softplus=True, chunk_size=64)
    # seeded, so that the error does not depend on which tests ran before
    dy = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(1),
                     dtype=y_ref.dtype)
    g_ref = torch.autograd.grad(y_ref, [ref_in[k] for k in grads_of], dy)

    cu_in = {k: v.cuda().requires_grad_(k in grads_of) for k, v in inputs.items()}
    y = ssd_triton(**cu_in, dt_softplus=True)
    g = torch.autograd.grad(y, [cu_in[k] for k in grads_of], dy.cuda().to(dtype))
    assert torch.isfinite(y).all()
    errors = {'y': rel(y.cpu(), y_ref)}
    errors.update({f'd{k}': rel(a.cpu(), b) for k, a, b in zip(grads_of, g, g_ref)})
    assert max(errors.values()) < tol, errors


@pytest.mark.parametrize('shape', [(2, 198, 4, 64, 1, 64), (3, 37, 6, 48, 2, 16)])
def test_backward_never_reads_the_unwritten_zero_states(shape):
    """The state sweeps leave ``hin[0]`` and ``dout[last]`` (zero by definition)
    unwritten and every load of them is masked: with work buffers the test fills
    with NaN, the gradients are bit for bit those with zero-filled buffers (4
    chunks, and 1 chunk where both are the same chunk)."""
    from mmdinomamba.ops.triton.ssd_bwd import scan_backward, state_buffers
    from mmdinomamba.ops.triton.ssd_common import ScanArgs, default_backward_chunk
    batch, seqlen, nheads, headdim, ngroups, dstate = shape
    inputs = {k: v.cuda() for k, v in _scan_inputs(*shape, torch.float32, seed=0).items()}
    x5, B5, C5 = (inputs[k][:, :, None] for k in ('x', 'B', 'C'))
    D = inputs['D'][:, None].expand(-1, headdim).contiguous()
    args = ScanArgs(x5, B5, C5, inputs['dt'], inputs['dt_bias'], inputs['A'], D, True,
                    default_backward_chunk(seqlen))
    dy = torch.randn_like(x5)
    results = []
    for fill in (0.0, float('nan')):
        hin, dout = state_buffers(args)
        hin.fill_(fill)
        dout.fill_(fill)
        dx = torch.empty_like(x5)
        results.append([dx, *scan_backward(args, dy, dx, states=(hin, dout))])
    assert all(t.isfinite().all() for t in results[1]), 'NaN from an unwritten state'
    for name, a, b in zip('dx dB dC ddt dA dbias dD'.split(), *results):
        assert torch.equal(a, b), name


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('shape', [(2, 198, 4, 64, 1, 64), (1, 1026, 2, 64, 1, 64)])
def test_bf16_sum_gradients_as_accurate_as_the_pytorch_path(shape, seed):
    """dA, dD and d(dt_bias) sum over every token, with cancellation, so their bf16
    error is set by the inputs; the bound is relative to the error of the PyTorch
    chunked path on the same bf16 inputs (both against float64). Measured on an H200
    with this computation: at most 2.5x for dA, 1x for dD, 4.75x (0.0019 against
    0.0004) for d(dt_bias); the bound is 4x + 1e-3."""
    from mmdinomamba.ops.triton import ssd_triton
    inputs = _scan_inputs(*shape, dtype=torch.bfloat16, seed=sum(shape))
    grads_of = ('A', 'D', 'dt_bias')
    ref_in = {k: v.double().requires_grad_(k in grads_of) for k, v in inputs.items()}
    y_ref = ssd_chunked(**ref_in, dt_softplus=True, chunk_size=64)
    dy = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(seed),
                     dtype=y_ref.dtype)
    g_ref = torch.autograd.grad(y_ref, [ref_in[k] for k in grads_of], dy)
    errors = {}
    for device in ('cpu', 'cuda'):
        lp = {k: v.to(device).requires_grad_(k in grads_of) for k, v in inputs.items()}
        y = (ssd_chunked(**lp, dt_softplus=True, chunk_size=64) if device == 'cpu'
             else ssd_triton(**lp, dt_softplus=True))
        g = torch.autograd.grad(y, [lp[k] for k in grads_of],
                                dy.to(device, torch.bfloat16))
        errors[device] = {k: rel(a.cpu(), b) for k, a, b in zip(grads_of, g, g_ref)}
    for k in grads_of:
        assert errors['cuda'][k] <= 4 * errors['cpu'][k] + 1e-3, (k, errors)


@pytest.mark.parametrize('chunk', [16, 32, 64, 128])
def test_scan_tile_size_does_not_change_result(chunk):
    """Every tile size computes the same function, forward and backward (fp32, so
    differences are rounding): the chunked op's output and gradients."""
    from mmdinomamba.ops.triton.ssd_bwd import scan_backward, sum_heads
    from mmdinomamba.ops.triton.ssd_common import ScanArgs
    from mmdinomamba.ops.triton.ssd_fwd import scan_forward
    inputs = {k: v.cuda() for k, v in
              _scan_inputs(2, 150, 3, 32, 1, 32, torch.float32, seed=chunk).items()}
    leaves = {k: v.clone().requires_grad_(k in ('x', 'B', 'C')) for k, v in inputs.items()}
    y_ref = ssd_chunked(**leaves, dt_softplus=True)
    dy = torch.randn_like(y_ref)
    gx, gB, gC = torch.autograd.grad(y_ref, [leaves['x'], leaves['B'], leaves['C']], dy)
    x5, B5, C5 = (inputs[k][:, :, None] for k in ('x', 'B', 'C'))
    D = inputs['D'][:, None].expand(-1, 32).contiguous()
    args = ScanArgs(x5, B5, C5, inputs['dt'], inputs['dt_bias'], inputs['A'], D, True,
                    chunk)
    assert rel(scan_forward(args, torch.empty_like(x5))[:, :, 0], y_ref) < FP32_TOL
    dx = torch.empty_like(x5)
    dB, dC = scan_backward(args, dy[:, :, None].contiguous(), dx)[:2]
    assert rel(dx[:, :, 0], gx) < FP32_TOL
    assert rel(sum_heads(dB, 1, 1)[:, :, 0], gB) < FP32_TOL
    assert rel(sum_heads(dC, 1, 1)[:, :, 0], gC) < FP32_TOL


def _perturbed_mixer(seed, **kwargs):
    torch.manual_seed(seed)
    mixer = SSDMixer(**kwargs)
    with torch.no_grad():  # move norms and D away from 1 so swaps would show
        for name, p in mixer.named_parameters():
            if 'norm' in name or name.startswith('D'):
                p.add_(torch.randn_like(p) * 0.3)
    return mixer


def _grads(module, u, out, dy):
    params = [u] + list(module.parameters())
    return torch.autograd.grad(out, params, dy)


@pytest.mark.parametrize('amp', [False, True])
@pytest.mark.parametrize('cfg', [
    dict(dim=128, d_state=64, headdim=64, bidirectional=True, seqlen=198),
    dict(dim=64, d_state=16, headdim=16, ngroups=2, bidirectional=True, seqlen=70,
         bias=True),
    dict(dim=64, d_state=32, headdim=32, bidirectional=False, seqlen=45),
])
def test_fused_mixer_matches_reference_path(cfg, amp):
    cfg = dict(cfg)
    seqlen = cfg.pop('seqlen')
    mixer = _perturbed_mixer(seqlen, **cfg).cuda()
    u = torch.randn(2, seqlen, cfg['dim'], device='cuda', requires_grad=True)
    assert mixer.uses_fused_path(mixer.in_proj(u))
    with torch.autocast('cuda', dtype=torch.bfloat16, enabled=amp):
        y = mixer(u)
    dy = torch.randn_like(y)
    g = _grads(mixer, u, y, dy)

    ref = _perturbed_mixer(seqlen, **cfg, ssd_backend='chunked').double()
    ref.load_state_dict(mixer.state_dict())
    u_ref = u.detach().cpu().double().requires_grad_()
    y_ref = ref(u_ref)
    g_ref = _grads(ref, u_ref, y_ref, dy.cpu().double())
    tol = BF16_TOL if amp else FP32_TOL
    names = ['u'] + [n for n, _ in ref.named_parameters()]
    errors = {'y': rel(y.float().cpu(), y_ref)}
    errors.update({f'd{n}': rel(a.float().cpu(), b) for n, a, b in zip(names, g, g_ref)})
    assert max(errors.values()) < tol, errors


@pytest.mark.parametrize('with_residual,scaled', [(False, False), (True, False),
                                                   (True, True)])
@pytest.mark.parametrize('amp', [False, True])
def test_add_rms_norm_matches_reference(with_residual, scaled, amp):
    torch.manual_seed(0)
    h = torch.randn(4, 50, 96, device='cuda', requires_grad=True)
    res = torch.randn(4, 50, 96, device='cuda', requires_grad=True) \
        if with_residual else None
    w = (1 + 0.3 * torch.randn(96, device='cuda')).requires_grad_()
    # stochastic depth: sample 1 dropped, the others scaled by 1 / keep
    scale = torch.tensor([1.25, 0., 1.25, 1.25], device='cuda') if scaled else None
    with torch.autocast('cuda', dtype=torch.bfloat16, enabled=amp):
        r, n = add_rms_norm(h, res, w, 1e-5, scale)
    assert n.dtype == (torch.bfloat16 if amp else torch.float32)
    dr, dn = torch.randn_like(r), torch.randn_like(n.float())
    leaves = [h, w] + ([res] if with_residual else [])
    g = torch.autograd.grad([r, n], leaves, [dr, dn.to(n.dtype)])

    hd, wd = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    resd = res.detach().double().requires_grad_() if with_residual else None
    hs = hd * scale.double()[:, None, None] if scaled else hd
    r_ref = hs + resd if with_residual else hs
    n_ref = rms_norm(r_ref, wd, 1e-5)
    leaves_ref = [hd, wd] + ([resd] if with_residual else [])
    g_ref = torch.autograd.grad([r_ref, n_ref], leaves_ref, [dr.double(), dn.double()])
    tol = BF16_TOL if amp else FP32_TOL
    assert rel(r, r_ref) < FP32_TOL  # the stream is always float32
    assert rel(n.float(), n_ref) < tol
    for a, b in zip(g, g_ref):
        assert rel(a, b) < tol


def test_dinovim_fused_matches_cpu_reference():
    """A small DinoVim, forward and all parameter gradients, CUDA fused vs CPU float64."""
    torch.manual_seed(0)
    kwargs = dict(arch=dict(embed_dims=128, num_layers=3), img_size=64,
                  drop_path_rate=0.0, out_type='featmap')
    model = DinoVim(**kwargs).cuda()
    ref = DinoVim(**kwargs, mixer_cfg=dict(ssd_backend='chunked')).double()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 64, 64)
    out = model(x.cuda())[0]
    out_ref = ref(x.double())[0]
    dy = torch.randn_like(out_ref)
    g = torch.autograd.grad(out, list(model.parameters()), dy.cuda().float())
    g_ref = torch.autograd.grad(out_ref, list(ref.parameters()), dy)
    assert rel(out.cpu(), out_ref) < FP32_TOL
    errors = {n: rel(a.cpu(), b)
              for (n, _), a, b in zip(ref.named_parameters(), g, g_ref)}
    assert max(errors.values()) < FP32_TOL, errors


@pytest.mark.parametrize('name,registers', [(VIM, 0), (MAMBAR, 12)])
def test_dinovim_fused_reproduces_official_fixtures(name, registers):
    """The released models' outputs (fixtures README: 1e-3 is a safe tolerance)."""
    data = load_reference(name)
    model = DinoVim(arch=dict(embed_dims=256, num_layers=4), num_registers=registers,
                    drop_path_rate=0.0).cuda().eval()
    model.load_state_dict({k: v for k, v in data['state_dict'].items()
                           if not k.startswith('head.')})
    for case in data['cases']:
        x = case['input'].cuda()
        with torch.no_grad():
            out = model(x)[0]
            inter = model.get_intermediate_layers(x, 2)
        assert rel(out.cpu(), case['output']) < 1e-3
        for a, b in zip(inter, case['last2_intermediate']):
            assert rel(a.cpu(), b) < 1e-3


def test_scan_work_splits_do_not_change_result():
    """Channel blocks of the forward and the backward's chunk size only split the
    work: the results equal the default kernels' (checked above against the
    reference) up to fp32 rounding. 710 tokens leave a 6-token last chunk (chunks 32
    and 64), which the backward runs in a launch of its own."""
    from mmdinomamba.ops.triton.ssd_bwd import scan_backward
    from mmdinomamba.ops.triton.ssd_common import ScanArgs
    from mmdinomamba.ops.triton.ssd_fwd import scan_forward
    torch.manual_seed(0)
    batch, seqlen, nheads = 2, 710, 8
    xbc = torch.randn(batch, seqlen, 2, nheads * 32 + 2 * 32, device='cuda')
    raw = torch.randn(batch, seqlen, nheads, device='cuda') - 1
    di = nheads * 32
    bias = torch.randn(2 * nheads, device='cuda')
    A = -torch.rand(2 * nheads, device='cuda') * 8
    D = torch.randn(2 * nheads, 32, device='cuda')

    def scan_args(chunk):
        return ScanArgs(xbc[..., :di].view(batch, seqlen, 2, nheads, 32),
                        xbc[..., di:di + 32].view(batch, seqlen, 2, 1, 32),
                        xbc[..., di + 32:].view(batch, seqlen, 2, 1, 32), raw, bias,
                        A, D, True, chunk)

    shape = (batch, seqlen, 2, nheads, 32)
    y1 = scan_forward(scan_args(32), torch.empty(shape, device='cuda'), p_blocks=1)
    y2 = scan_forward(scan_args(32), torch.empty(shape, device='cuda'), p_blocks=2)
    assert rel(y2, y1) < 1e-5
    dy = torch.randn(shape, device='cuda')
    outs = {}
    for chunk in (16, 32, 64):
        dx = torch.empty(shape, device='cuda')
        outs[chunk] = [dx, *scan_backward(scan_args(chunk), dy, dx)]
    # other chunkings reorder the fp32 sums (dA sums ~10^4 terms that cancel), so
    # they get the tolerance used against the float64 reference
    for chunk in (16, 64):
        for a, b in zip(outs[chunk], outs[32]):
            assert rel(a, b) < FP32_TOL


def _long_bf16_scan(seqlen, dt_shift, A_max, device='cuda'):
    """A bidirectional scan of one image as DinoVim-B's heads and states (4 heads of
    64, state 64, one group, bf16 inputs, chunk 32): raw steps ``randn + dt_shift``,
    ``A`` uniform in (-A_max, 0), seeded."""
    from mmdinomamba.ops.triton.ssd_common import ScanArgs
    torch.manual_seed(0)
    batch, nheads, hd, N = 1, 4, 64, 64
    bf = dict(device=device, dtype=torch.bfloat16)
    x = torch.randn(batch, seqlen, 2, nheads, hd, **bf)
    B, C = (torch.randn(batch, seqlen, 2, 1, N, **bf) for _ in range(2))
    raw = torch.randn(batch, seqlen, nheads, device=device) + dt_shift
    return ScanArgs(x, B, C, raw, torch.randn(2 * nheads, device=device),
                    -torch.rand(2 * nheads, device=device) * A_max,
                    torch.randn(2 * nheads, hd, device=device), True, 32)


def test_four_channel_blocks_equal_one_for_64_wide_heads():
    """Four 16-wide channel blocks per 64-wide head (``scan_forward(p_blocks=4)``)
    give the one-block result up to rounding (bf16 inputs, DinoVim-B's state
    size)."""
    from mmdinomamba.ops.triton.ssd_fwd import scan_forward
    args = _long_bf16_scan(1025, dt_shift=-1, A_max=8)
    ys = [scan_forward(args, torch.empty_like(args.x), p_blocks=n) for n in (1, 4)]
    assert rel(ys[1].float(), ys[0].float()) < 1e-2  # bf16 outputs: unit roundoff 2^-8


def test_segments_equal_one_uncut_scan_for_a_long_sequence():
    """The forward cut into segments (what default_segments picks at 1024 px for
    small batches, and an odd cut whose last segment is short) gives the uncut
    scan's result up to rounding (bf16 inputs, DinoVim-B's head and state sizes,
    with four channel blocks too)."""
    from mmdinomamba.ops.triton.ssd_fwd import default_segments, scan_forward
    # small steps, so that the state carries across segments (129 chunks of 32)
    args = _long_bf16_scan(4098, dt_shift=-4, A_max=1)
    assert default_segments(args, 4) == 8
    ys = [scan_forward(args, torch.empty_like(args.x), p_blocks=4, segments=n)
          for n in (1, 8, 5)]
    for y in ys[1:]:
        assert rel(y.float(), ys[0].float()) < 1e-2  # bf16 outputs: 2^-8


@pytest.mark.parametrize('cap', [128, 168])
def test_register_caps_do_not_change_result(cap):
    """Capping registers (the default for big grids, :func:`occupancy_maxnreg`)
    only moves values between registers and spill memory: bf16, 64-wide heads and
    states as DinoVim-B, forward and backward equal the uncapped kernels'."""
    from mmdinomamba.ops.triton.ssd_bwd import scan_backward
    from mmdinomamba.ops.triton.ssd_common import ScanArgs
    from mmdinomamba.ops.triton.ssd_fwd import scan_forward
    torch.manual_seed(0)
    batch, seqlen, nheads, P, N = 3, 198, 4, 64, 64
    di = nheads * P
    xbc = torch.randn(batch, seqlen, 2, di + 2 * N, device='cuda').bfloat16()
    raw = (torch.randn(batch, seqlen, nheads, device='cuda') - 2).bfloat16()
    bias = torch.randn(2 * nheads, device='cuda') * 0.5 - 3
    A = -torch.rand(2 * nheads, device='cuda') * 15 - 1
    D = torch.randn(2 * nheads, P, device='cuda')
    shape = (batch, seqlen, 2, nheads, P)
    outs = []
    for chunk, reg in ((32, None), (32, cap), (64, None), (64, cap)):
        args = ScanArgs(xbc[..., :di].view(shape),
                        xbc[..., di:di + N].view(batch, seqlen, 2, 1, N),
                        xbc[..., di + N:].view(batch, seqlen, 2, 1, N), raw, bias, A, D,
                        True, chunk)
        if chunk == 32:
            outs.append([scan_forward(args, torch.empty(shape, device='cuda',
                                                        dtype=torch.bfloat16),
                                      maxnreg=reg)])
        else:
            dy = torch.randn(shape, device='cuda', generator=torch.Generator(
                'cuda').manual_seed(1)).bfloat16()
            dx = torch.empty_like(dy)
            outs.append([dx, *scan_backward(args, dy, dx, maxnreg=reg,
                                            states_maxnreg=reg)])
    for free, capped in ((outs[0], outs[1]), (outs[2], outs[3])):
        for a, b in zip(free, capped):
            assert rel(b, a) < 1e-6


def test_occupancy_cap_only_for_big_grids():
    from mmdinomamba.ops.triton.ssd_common import (OCCUPANCY_MAXNREG,
                                                   OCCUPANCY_PROGRAMS_PER_SM,
                                                   occupancy_maxnreg)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dev = torch.device('cuda')
    assert occupancy_maxnreg(OCCUPANCY_PROGRAMS_PER_SM * sms, dev) is None
    assert occupancy_maxnreg(OCCUPANCY_PROGRAMS_PER_SM * sms + 1, dev) == OCCUPANCY_MAXNREG


def test_fused_dinovim_replays_from_a_cuda_graph():
    """The fused path never reads the device from the host, so a whole forward can
    be captured in a CUDA graph; a replay on new input equals the eager forward."""
    torch.manual_seed(0)
    model = DinoVim(arch=dict(embed_dims=128, num_layers=2), img_size=64,
                    drop_path_rate=0.0).cuda().eval()
    static_x = torch.randn(2, 3, 64, 64, device='cuda')
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        model(static_x)  # compile the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = model(static_x)[0]
    x = torch.randn(2, 3, 64, 64, device='cuda')
    static_x.copy_(x)
    graph.replay()
    with torch.no_grad():
        eager = model(x)[0]
    assert rel(static_out, eager) < FP32_TOL


@pytest.mark.parametrize('A_value', [-1e-6, -16.0, -1e30, float('-inf')])
@pytest.mark.parametrize('dt_value', [1e-30, 1e-2, 1e5, 1e35])
def test_triton_finite_and_equal_to_the_recurrence_for_extreme_dt_and_A(dt_value, A_value):
    """The kernels floor each token's log-decay at float32's exp range: finite and
    equal to the float64 recurrence where the math is finite (fp32 tolerance, as the
    PyTorch backends' sweep in tests/ops/test_ssd.py)."""
    from mmdinomamba.ops import ssd_ref
    from mmdinomamba.ops.triton import ssd_triton
    g = torch.Generator().manual_seed(0)
    batch, seqlen, nheads, headdim, dstate = 2, 150, 2, 8, 4  # small: 1e35 * x * B C fits
    x = torch.randn(batch, seqlen, nheads, headdim, generator=g)
    B = torch.randn(batch, seqlen, 1, dstate, generator=g)
    C = torch.randn(batch, seqlen, 1, dstate, generator=g)
    dt = dt_value * (1 + torch.rand(batch, seqlen, nheads, generator=g))
    A = torch.full((nheads, ), A_value)
    want = ssd_ref(x.double(), dt.double(), A.double(), B.double(), C.double())
    assert torch.isfinite(want).all()
    got = ssd_triton(x.cuda(), dt.cuda(), A.cuda(), B.cuda(), C.cuda()).cpu()
    assert torch.isfinite(got).all()
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
