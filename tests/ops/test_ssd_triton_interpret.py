"""The Triton kernels' arithmetic on the CPU, through Triton's interpreter.

``TRITON_INTERPRET=1`` runs every kernel with NumPy, so the kernels' math (chunk
scan forward and backward, both directions, conv, gated norm, add + norm) is
checked without a GPU. It must be set before Triton compiles anything, hence the
subprocess. Everything runs in float32 with IEEE dots, so the error against the
float64 reference is fp32 rounding (about 1e-7 here); 1e-5 catches any wrong term.
The ways of splitting the work (channel blocks and segments of the forward, the
backward's chunk size) are compared with each other; the reference checks the default.
"""
import json
import os
import os.path as osp
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip('triton')

REPO = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
TOL = 1e-5
# results rounded to float16 once or twice on the way (unit roundoff 2^-11 ~ 4.9e-4)
HALF_TOL = 2e-3

# what every script starts with: `rel` (norm-relative error), `errors` (printed as
# JSON at the end), the seed
PRELUDE = r'''
import json
import torch
from mmdinomamba.models.mixers import SSDMixer

def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()

torch.manual_seed(0)
errors = {}
'''
END = "print('ERRORS=' + json.dumps(errors))\n"


def run_in_interpreter(script: str) -> dict:
    """Run PRELUDE + script + END under TRITON_INTERPRET=1; the errors it printed."""
    env = dict(os.environ, TRITON_INTERPRET='1', PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, '-c', PRELUDE + script + END], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith('ERRORS=')][-1]
    return json.loads(line[len('ERRORS='):])


SCRIPT = r'''
from mmdinomamba.ops import rms_norm, ssd_ref
from mmdinomamba.ops.triton import add_rms_norm_triton, mixer_core_triton, ssd_triton

# one direction, several chunks (5 forward, 3 backward with a short last one), two
# groups, per-channel D, gate z
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
errors['scan.y'] = rel(y, y_ref)
for name, a, b in zip('x dt A B C D dt_bias z'.split(), g, g_ref):
    errors['scan.d' + name] = rel(a, b)

# bidirectional mixer: fused core vs the reference path of the same module, with
# and without the conv's bias
for key, conv_bias in (('mixer', True), ('mixer_nobias', False)):
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
    errors[key + '.y'] = rel(y, y_ref)
    with torch.no_grad():  # the forward alone, outside the autograd function
        y_nograd = mixer_core_triton(mixer.in_proj(u32), mixer.core_params(), mixer.spec)
    errors[key + '.no_grad_bits'] = (y_nograd - y).abs().max().item()
    names = ['u'] + [n for n, _ in mixer.named_parameters()]
    for name, a, b in zip(names, g, g_ref):
        errors[key + '.d' + name] = rel(a, b)

# residual add + RMSNorm
h = torch.randn(3, 5, 40, requires_grad=True)
r = torch.randn(3, 5, 40, requires_grad=True)
w = torch.randn(40, requires_grad=True)
res, out = add_rms_norm_triton(h, r, w, 1e-5, torch.float32)
res_ref = h.double() + r.double()
out_ref = rms_norm(res_ref, w.double(), 1e-5)
gr, go = torch.randn_like(res_ref), torch.randn_like(out_ref)
g = torch.autograd.grad([res, out], [h, r, w], [gr.float(), go.float()])
g_ref = torch.autograd.grad([res_ref, out_ref], [h, r, w], [gr, go])
errors['addnorm.out'] = rel(out, out_ref)
for name, a, b in zip(['h', 'residual', 'weight'], g, g_ref):
    errors['addnorm.d' + name] = rel(a, b)
# the same with a per-sample stochastic-depth factor (one sample dropped)
sc = torch.tensor([0., 1.25, 0.8])
res, out = add_rms_norm_triton(h, r, w, 1e-5, torch.float32, sc)
res_ref = h.double() * sc.double()[:, None, None] + r.double()
out_ref = rms_norm(res_ref, w.double(), 1e-5)
g = torch.autograd.grad([res, out], [h, r, w], [gr.float(), go.float()])
g_ref = torch.autograd.grad([res_ref, out_ref], [h, r, w], [gr, go])
with torch.no_grad():
    nograd = add_rms_norm_triton(h, r, w, 1e-5, torch.float32, sc)
errors['addnorm_scaled.no_grad_bits'] = max((a - b).abs().max().item()
                                            for a, b in zip(nograd, (res, out)))
errors['addnorm_scaled.res'] = rel(res, res_ref)
errors['addnorm_scaled.out'] = rel(out, out_ref)
for name, a, b in zip(['h', 'residual', 'weight'], g, g_ref):
    errors['addnorm_scaled.d' + name] = rel(a, b)
# a float16 output (autocast): the stream stays float32, the backward reads the
# normalised rows kept in float16 (and no float32 row of the residual)
kept = []
def keep(t):
    kept.append(t)
    return t
with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
    res, out = add_rms_norm_triton(h, r, w, 1e-5, torch.float16, sc)
go16 = go.half()
res_ref = h.double() * sc.double()[:, None, None] + r.double()
out_ref = rms_norm(res_ref, w.double(), 1e-5)
g = torch.autograd.grad([res, out], [h, r, w], [gr.float(), go16])
g_ref = torch.autograd.grad([res_ref, out_ref], [h, r, w], [gr, go16.double()])
errors['addnorm16.res'] = rel(res, res_ref)
errors['addnorm16.kept_float32_rows'] = float(sum(
    t.dtype == torch.float32 and t.numel() == h.numel() for t in kept))
errors['half:addnorm16.out'] = rel(out, out_ref)
for name, a, b in zip(['h', 'residual', 'weight'], g, g_ref):
    errors['half:addnorm16.d' + name] = rel(a, b)
# both directions' conv + SiLU over several token blocks, against torch's conv1d
from mmdinomamba.ops.triton.conv import BWD_BLOCK_T, FWD_BLOCK_T, conv_backward, conv_forward
L = 2 * max(FWD_BLOCK_T, BWD_BLOCK_T) + 22
xc = torch.randn(2, L, 24, requires_grad=True)
wc = torch.randn(2, 24, 4, requires_grad=True)
bc = torch.randn(2, 24, requires_grad=True)
def conv_ref(x, w, b):
    f = torch.nn.functional
    y0 = f.conv1d(x.transpose(1, 2), w[0][:, None], b[0], padding=3, groups=24)[..., :L]
    y1 = f.conv1d(x.flip(1).transpose(1, 2), w[1][:, None], b[1], padding=3,
                  groups=24)[..., :L].flip(-1)
    return f.silu(torch.stack([y0, y1], 1).permute(0, 3, 1, 2))
ref = conv_ref(xc.double(), wc.double(), bc.double())
gout = torch.randn_like(ref)
g_ref = torch.autograd.grad(ref, [xc, wc, bc], gout)
out = conv_forward(xc.detach(), wc.detach(), bc.detach(), torch.empty(2, L, 2, 24))
dxc = torch.empty(2, L, 24)
dw, db = conv_backward(xc.detach(), wc.detach(), bc.detach(), gout.float(), dxc)
errors['conv.out'] = rel(out, ref)
for name, a, b in zip(['x', 'w', 'b'], [dxc, dw, db], g_ref):
    errors['conv.d' + name] = rel(a, b)

# work splits: channel blocks of the forward scan; the chunk size of the backward
# (70 tokens: with chunk 32 the last 6 are a separate launch with a 16-token tile)
from mmdinomamba.ops.triton.ssd_bwd import scan_backward
from mmdinomamba.ops.triton.ssd_common import ScanArgs
from mmdinomamba.ops.triton.ssd_fwd import scan_forward
xbc = torch.randn(1, 70, 2, 4 * 16 + 2 * 16)
raw = torch.randn(1, 70, 4) - 1
def scan_args(chunk):
    return ScanArgs(xbc[..., :64].view(1, 70, 2, 4, 16),
                    xbc[..., 64:80].view(1, 70, 2, 1, 16),
                    xbc[..., 80:].view(1, 70, 2, 1, 16), raw, bias8, A8, D8, True, chunk)
bias8, A8, D8 = torch.randn(8), -torch.rand(8) * 4, torch.randn(8, 16)
# two channel blocks of 32-wide heads (chunk 16); four of 64-wide heads (chunk 32)
for headdim, blocks, chunk in ((32, 2, 16), (64, 4, 32)):
    xp = torch.randn(1, 70, 2, 4, headdim)
    argsp = ScanArgs(xp, xbc[..., 64:80].view(1, 70, 2, 1, 16),
                     xbc[..., 80:].view(1, 70, 2, 1, 16), raw, bias8, A8,
                     torch.randn(8, headdim), True, chunk)
    ys = [scan_forward(argsp, torch.empty_like(xp), p_blocks=n) for n in (1, blocks)]
    errors[f'pblocks{blocks}.y'] = rel(ys[1], ys[0])
    # the sequence cut into segments (5 chunks of 16: 2 segments of 3 and 2 chunks,
    # 3 of 2, 2, 1, one per chunk), with the channel blocks
    if chunk == 16:
        for segments in (2, 3, 5):
            ys_seg = scan_forward(argsp, torch.empty_like(xp), p_blocks=blocks,
                                  segments=segments)
            errors[f'segments{segments}.y'] = rel(ys_seg, ys[0])
dy = torch.randn(1, 70, 2, 4, 16)
outs = []
for chunk in (16, 32):
    dx = torch.empty(1, 70, 2, 4, 16)
    outs.append([dx, *scan_backward(scan_args(chunk), dy, dx)])
for name, a, b in zip('dx dB dC ddt dA dbias dD'.split(), outs[1], outs[0]):
    errors[f'chunk32.{name}'] = rel(a, b)
# the mixer's layout: A_log and a per-head D read by the kernels as they are,
# against A = -exp(A_log) and D expanded over the channels (forward cut in
# segments too, so that the segment-state kernel reads A_log; backward, whose dA
# is then A_log's gradient)
Alog8, Dh8 = torch.randn(8) * 0.5, torch.randn(8)
def layout_args(chunk, log):
    A, D = Alog8, Dh8
    if not log:
        A, D = -Alog8.exp(), Dh8[:, None].expand(8, 16).contiguous()
    return ScanArgs(xbc[..., :64].view(1, 70, 2, 4, 16),
                    xbc[..., 64:80].view(1, 70, 2, 1, 16),
                    xbc[..., 80:].view(1, 70, 2, 1, 16), raw, bias8, A, D, True, chunk,
                    a_log=log)
y_lin = scan_forward(layout_args(16, False), torch.empty(1, 70, 2, 4, 16), segments=1)
for segments in (1, 2):
    y_log = scan_forward(layout_args(16, True), torch.empty(1, 70, 2, 4, 16),
                         segments=segments)
    errors[f'a_log_segments{segments}.y'] = rel(y_log, y_lin)
outs = []
for log in (True, False):
    dx = torch.empty(1, 70, 2, 4, 16)
    outs.append([dx, *scan_backward(layout_args(32, log), dy, dx, dD_per_slot=True)])
outs[1][4] = outs[1][4] * -Alog8.exp()  # dA_log = dA * A
for name, a, b in zip('dx dB dC ddt dA_log dbias dD'.split(), outs[0], outs[1]):
    errors[f'a_log.{name}'] = rel(a, b)
# extreme steps (float32's exp range): one token with dt * |A| = 1e5 among small
# steps in head 0; in head 1 a run of dt = 1e36 (A = -16), whose log-decays summed
# over a chunk leave float32's range (-inf - -inf was NaN); the recurrence in
# float64 is finite and is the truth
xe, Be, Ce = torch.randn(1, 80, 2, 16), torch.randn(1, 80, 1, 16), torch.randn(1, 80, 1, 16)
dte = torch.rand(1, 80, 2) * 0.1
dte[0, 10, 0] = 1e5 / 4
dte[0, 40:80, 1] = 1e36
Ae = torch.tensor([-4., -16.])
ye = ssd_triton(xe, dte, Ae, Be, Ce)
ye_ref = ssd_ref(xe.double(), dte.double(), Ae.double(), Be.double(), Ce.double())
errors['extreme_dt.finite'] = 0.0 if bool(ye.isfinite().all()) else 1.0
errors['extreme_dt.y'] = rel(ye, ye_ref)
# the same cut into segments, as default_segments cuts it when chunks are allowed
# to be segments (2 segments of the 3 chunks: the carried state crosses 1e36 steps)
from mmdinomamba.ops.triton import ssd_fwd
ssd_fwd.FWD_MIN_SEGMENT_CHUNKS = 1
ye_seg = ssd_triton(xe, dte, Ae, Be, Ce)
errors['extreme_dt_segments.finite'] = 0.0 if bool(ye_seg.isfinite().all()) else 1.0
errors['extreme_dt_segments.y'] = rel(ye_seg, ye_ref)
'''


def test_triton_kernels_in_interpreter():
    errors = run_in_interpreter(SCRIPT)
    expected = {'scan.y', 'scan.dz', 'scan.dA', 'scan.dD', 'mixer.y', 'mixer.du',
                'mixer.dA_log_b', 'mixer.dconv1d_b.weight', 'mixer.dnorm_b.weight',
                'mixer.din_proj.weight', 'mixer_nobias.y', 'mixer_nobias.dA_log_b',
                'mixer_nobias.dconv1d_b.weight', 'addnorm.out', 'addnorm.dweight',
                'pblocks2.y', 'pblocks4.y', 'segments2.y', 'segments3.y',
                'segments5.y', 'extreme_dt_segments.finite', 'extreme_dt_segments.y',
                'chunk32.dB', 'chunk32.dC', 'chunk32.ddt', 'chunk32.dD',
                'conv.out', 'conv.dx', 'conv.dw', 'conv.db', 'extreme_dt.finite',
                'extreme_dt.y', 'a_log_segments1.y', 'a_log_segments2.y',
                'a_log.dx', 'a_log.dA_log', 'a_log.dD', 'a_log.ddt', 'a_log.dbias',
                'mixer.no_grad_bits', 'mixer_nobias.no_grad_bits',
                'addnorm_scaled.no_grad_bits'}
    assert expected <= set(errors), sorted(errors)
    assert {'half:addnorm16.out', 'half:addnorm16.dh', 'addnorm16.kept_float32_rows'} \
        <= set(errors)
    bad = {k: v for k, v in errors.items()
           if not v < (HALF_TOL if k.startswith('half:') else TOL)}
    assert not bad, bad


OP_SCRIPT = r'''
from mmdinomamba.ops import mixer_core_ref
from mmdinomamba.ops.triton import mixer_core_triton
from mmdinomamba.ops.triton.mixer import mixer_core_op

mixer = SSDMixer(32, d_state=16, headdim=16, chunk_size=16, bias=True)
for p in mixer.parameters():  # every parameter away from its initial value
    p.data += 0.1 * torch.randn_like(p)
u = torch.randn(2, 24, 32, requires_grad=True)
params = [u] + list(mixer.parameters())
dy = torch.randn(2, 24, 32)

def grads(fn):
    y = fn(mixer.in_proj(u), mixer.core_params(), mixer.spec)
    return [y] + list(torch.autograd.grad(y, params, dy))

ref = grads(mixer_core_ref)
eager = grads(mixer_core_triton)
op = grads(mixer_core_op)
compiled = grads(torch.compile(mixer_core_op, backend='aot_eager', fullgraph=True))
for name, got in (('op', op), ('compiled', compiled)):
    errors[name + '.ref'] = max(rel(a, b) for a, b in zip(got, ref))
    # the same kernels in the same order: the same bits as the autograd function
    errors[name + '.eager_bits'] = max((a - b).abs().max().item()
                                       for a, b in zip(got, eager))

# what the backward keeps: the projection, the scan output y2 (batch, seqlen, ndir,
# d_inner), the norm's rstd (batch * seqlen, ndir, ngroups), out_proj's weight and
# the parameters; no conv output (the backward recomputes it)
s = mixer.spec
flat_numel = sum(p.numel() for p in mixer.parameters()
                 if p is not mixer.in_proj.weight and p is not mixer.in_proj.bias
                 and p is not mixer.out_proj.bias)
kept = mixer.in_proj(u).numel() + 2 * 24 * s.ndir * (s.d_inner + s.ngroups) + flat_numel
for name, fn in (('eager', mixer_core_triton), ('op', mixer_core_op)):
    zxbcdt = mixer.in_proj(u).detach().requires_grad_()
    saved = []
    def pack(t):
        saved.append(t.numel())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(zxbcdt, mixer.core_params(), s)
    errors[name + '.saved_extra'] = float(sum(saved) - kept)

# the op's schema, fake kernel and autograd registration, as torch.library checks them
zxbcdt = mixer.in_proj(u).detach().requires_grad_()
cp = mixer.core_params()
flat = [*cp.conv_w, *cp.conv_b, *cp.dt_bias, *cp.A_log, *cp.D, *cp.norm_w]
s = mixer.spec
torch.library.opcheck(torch.ops.mmdinomamba.mixer_core_fwd,
                      (zxbcdt, cp.out_w, cp.out_b, flat, s.d_inner, s.ngroups,
                       s.d_state, s.headdim, s.ndir, s.eps, True),
                      test_utils=('test_schema', 'test_faketensor',
                                  'test_autograd_registration'))
errors['opcheck'] = 0.0
'''


def test_mixer_custom_op_in_interpreter():
    """What torch.compile runs (the custom ops, traced by aot_eager as Inductor's
    front end traces them) equals the eager fused path bit for bit and the PyTorch
    reference to float32 rounding; torch.library's opcheck accepts the op; both keep
    no conv output for the backward."""
    errors = run_in_interpreter(OP_SCRIPT)
    assert set(errors) == {'op.ref', 'op.eager_bits', 'compiled.ref',
                           'compiled.eager_bits', 'opcheck', 'eager.saved_extra',
                           'op.saved_extra'}
    # the backward keeps no more than the projection, y2, rstd and the weights
    assert errors['eager.saved_extra'] == errors['op.saved_extra'] == 0.0, errors
    for name in ('op.ref', 'compiled.ref'):
        assert errors[name] < TOL, errors
    for name in ('op.eager_bits', 'compiled.eager_bits'):
        assert errors[name] == 0.0, errors


def test_forward_segments_only_for_long_sequences_at_small_batches(monkeypatch):
    """default_segments: one segment for training batches and for 1024 px at batch
    4 (their grids hold more than one program per multiprocessor), more at batch 1,
    never one of fewer than 8 chunks."""
    from mmdinomamba.ops.triton import ssd_fwd
    monkeypatch.setattr(ssd_fwd, 'sm_count', lambda device: 132)

    def segments(batch, nslots, nchunks, p_blocks=1):
        args = SimpleNamespace(batch=batch, nslots=nslots, nchunks=nchunks,
                               x=SimpleNamespace(device=torch.device('cuda')))
        return ssd_fwd.default_segments(args, p_blocks)

    assert segments(128, 48, 7) == 1  # DinoVim-B, 224 px, batch 128
    assert segments(4, 48, 129) == 1  # 1024 px, batch 4: 192 programs
    assert segments(1, 48, 129) == 4  # batch 1: 48 programs -> 192 (<= 2 x 132)
    assert segments(1, 48, 129, p_blocks=4) == 1  # channel blocks count as programs
    assert segments(1, 48, 15) == 1  # two segments of 15 chunks: 7.5 < 8 each
    assert segments(1, 48, 24) == 2  # 2 of 12 chunks; 4 of 6 would be too short
