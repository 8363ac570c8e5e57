"""The residual add + LayerNorm kernels (mmdinomamba.ops.triton.layer_norm) on the
CPU, through Triton's interpreter, against their PyTorch twin
(:func:`mmdinomamba.ops.add_layer_norm_ref`) in float64: forward and the gradients
of x, h, the weight and the bias, with and without the add, at widths 64 (a power
of two) and 96 (masked to 128), and with the residual output's gradient used or not.

Sizes: 600 rows give several forward programs and a last tile cut short; with the
multiprocessor count set to 1, the backward programs run 5 (width 64) or 8 (width 96)
tiles each, two or three of them, so the loop over tiles and the sum of the partial
weight and bias gradients across programs are both exercised.

Bounds (:mod:`.checks`): float32 runs, against float64, are float32 rounding (TOL).
A result rounded once to bfloat16 is within one unit (2^-8 relative for rounding to
nearest, 2^-7 where the interpreter's cast rounds toward zero): held to
:data:`BF16_TOL` = 2^-7 in norm. Where the residual itself is bfloat16, its rounding
(one unit) passes into the normalised rows, which are rounded again: two units,
2^-6.
"""
import pytest
import torch

from mmdinomamba.ops import add_layer_norm_ref
from mmdinomamba.ops.triton import add_layer_norm_triton, layer_norm
from .checks import TOL, assert_close_all, rel

BF16_TOL = 2**-7
ROWS = (3, 200)


@pytest.fixture(autouse=True)
def one_multiprocessor(monkeypatch):
    """Several tiles per backward program at these small sizes."""
    monkeypatch.setattr(layer_norm, 'sm_count', lambda device: 1)


def _inputs(dim, x_dtype=torch.float32, h_dtype=torch.float32,
            w_dtype=torch.float32, add=True):
    torch.manual_seed(dim)
    # an offset the norm removes: the centring must be right, not only the scale
    x = (torch.randn(*ROWS, dim) + 3.).to(x_dtype).requires_grad_(True)
    h = torch.randn(*ROWS, dim).to(h_dtype).requires_grad_(True) if add else None
    w = (1 + 0.5 * torch.randn(dim)).to(w_dtype).requires_grad_(True)
    b = (0.5 * torch.randn(dim)).to(w_dtype).requires_grad_(True)
    return x, h, w, b


def _run(fn, x, h, w, b, out_dtype, dout, dres):
    """Forward and the gradients of every input that takes one."""
    res, out = fn(x, h, w, b, 1e-5, out_dtype)
    loss = (out * dout.to(out.dtype)).sum()
    if dres is not None:
        loss = loss + (res * dres.to(res.dtype)).sum()
    ins = [t for t in (x, h, w, b) if t is not None]
    return (res, out, *torch.autograd.grad(loss, ins))


def _twin(x, h, w, b, dout, dres):
    """The twin in float64 on copies of the inputs."""
    d = [None if t is None else t.detach().double().requires_grad_(True)
         for t in (x, h, w, b)]
    return _run(add_layer_norm_ref, *d, torch.float64, dout.double(),
                None if dres is None else dres.double())


def _names(h):
    return ['res', 'out', 'dx'] + (['dh'] if h is not None else []) + ['dw', 'db']


@pytest.mark.parametrize('dim', [64, 96])
@pytest.mark.parametrize('add', [True, False], ids=['add', 'no-add'])
@pytest.mark.parametrize('res_grad', [True, False], ids=['dres', 'no-dres'])
def test_float32(dim, add, res_grad):
    x, h, w, b = _inputs(dim, add=add)
    dout = torch.randn(*ROWS, dim)
    dres = torch.randn(*ROWS, dim) if res_grad else None
    got = _run(add_layer_norm_triton, x, h, w, b, torch.float32, dout, dres)
    want = _twin(x, h, w, b, dout, dres)
    assert got[0].dtype == got[1].dtype == torch.float32
    assert all(g.dtype == t.dtype for g, t in zip(got[2:], [t for t in (x, h, w, b)
                                                             if t is not None]))
    assert_close_all({n: rel(g, r) for n, g, r in zip(_names(h), got, want)})
    if not add:  # without the add the residual is x itself: no copy
        assert got[0] is x


@pytest.mark.parametrize('dim', [64, 96])
def test_autocast_layout(dim):
    """What MLLA's blocks pass under bf16 autocast: a float32 stream x, the bf16
    CPE output h, float32 weights, the output in bf16. The residual and its
    gradient stay float32 (exact sums of a bf16 and a float32 term); h's
    gradient is rounded once to bf16, and so is the output."""
    x, h, w, b = _inputs(dim, h_dtype=torch.bfloat16)
    dout = torch.randn(*ROWS, dim).bfloat16()
    dres = torch.randn(*ROWS, dim)
    got = _run(add_layer_norm_triton, x, h, w, b, torch.bfloat16, dout, dres)
    want = _twin(x, h, w, b, dout, dres)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.bfloat16
    assert got[3].dtype == torch.bfloat16
    errors = {n: rel(g, r) for n, g, r in zip(_names(h), got, want)}
    assert_close_all({n: errors.pop(n) for n in ('out', 'dh')}, BF16_TOL)
    assert_close_all(errors, TOL)


@pytest.mark.parametrize('dim', [64, 96])
def test_bfloat16(dim):
    """A bf16 model without autocast: every tensor bf16. The residual is rounded to
    bf16 before the statistics, as ``x + h`` is in PyTorch; the twin is given the
    kernel's residual, so that only the rounding of its own outputs is compared."""
    x, h, w, b = _inputs(dim, torch.bfloat16, torch.bfloat16, torch.bfloat16)
    dout = torch.randn(*ROWS, dim).bfloat16()
    got = _run(add_layer_norm_triton, x, h, w, b, torch.bfloat16, dout, None)
    assert all(t.dtype == torch.bfloat16 for t in got)
    assert rel(got[0], x.double() + h.double()) < BF16_TOL
    res = got[0].detach().requires_grad_(True)  # the stream as the kernel rounded it
    want = _twin(res, None, w, b, dout, None)  # (res, out, dres, dw, db)
    errors = {'out': rel(got[1], want[1]), 'dx': rel(got[2], want[2]),
              'dh': rel(got[3], want[2]), 'dw': rel(got[4], want[3]),
              'db': rel(got[5], want[4])}
    assert_close_all(errors, BF16_TOL)


def test_no_grad_forward_is_the_recorded_forward():
    x, h, w, b = _inputs(96)
    res, out = add_layer_norm_triton(x, h, w, b, 1e-5, torch.float32)
    with torch.no_grad():
        res0, out0 = add_layer_norm_triton(x, h, w, b, 1e-5, torch.float32)
        x0, out1 = add_layer_norm_triton(x, None, w, b, 1e-5, torch.float32)
    assert torch.equal(res0, res) and torch.equal(out0, out) and x0 is x
    assert_close_all({'out(no add)': rel(out1, add_layer_norm_ref(
        x.double(), None, w.double(), b.double())[1])})


def test_without_affine_parameters():
    """``elementwise_affine=False``: no weight, no bias (no gradient for them)."""
    x, h, _, _ = _inputs(64)
    dout = torch.randn(*ROWS, 64)
    res, out = add_layer_norm_triton(x, h, None, None, 1e-5, torch.float32)
    dx, dh = torch.autograd.grad((out * dout).sum(), [x, h])
    xd, hd = (t.detach().double().requires_grad_(True) for t in (x, h))
    _, ref = add_layer_norm_ref(xd, hd, None, None, 1e-5)
    dx_ref, dh_ref = torch.autograd.grad((ref * dout.double()).sum(), [xd, hd])
    assert_close_all({'out': rel(out, ref), 'dx': rel(dx, dx_ref),
                      'dh': rel(dh, dh_ref)})
