"""The mixer core as torch.compile runs it (the custom ops of
``ops/triton/mixer.py``), through Triton's interpreter.

What torch.compile runs (the custom ops, traced by aot_eager as Inductor's front
end traces them) equals the eager fused path bit for bit and the PyTorch reference
to float32 rounding; torch.library's opcheck accepts the op; neither keeps a conv
output for the backward.
"""
import pytest
import torch

from mmdinomamba.models.mixers import SSDMixer
from mmdinomamba.ops import mixer_core_ref
from mmdinomamba.ops.triton import mixer_core_triton
from mmdinomamba.ops.triton.mixer import mixer_core_op
from .checks import TOL, bits, rel


@pytest.fixture(scope='module')
def mixer():
    torch.manual_seed(0)
    mixer = SSDMixer(32, d_state=16, headdim=16, chunk_size=16, bias=True)
    for p in mixer.parameters():  # every parameter away from its initial value
        p.data += 0.1 * torch.randn_like(p)
    return mixer


def outputs_and_grads(fn, mixer):
    torch.manual_seed(1)
    u = torch.randn(2, 24, 32, requires_grad=True)
    dy = torch.randn(2, 24, 32)
    y = fn(mixer.in_proj(u), mixer.core_params(), mixer.spec)
    return [y] + list(torch.autograd.grad(y, [u] + list(mixer.parameters()), dy))


@pytest.mark.parametrize('compiled', [False, True], ids=['op', 'compiled-op'])
def test_the_op_is_the_fused_path(mixer, compiled):
    fn = torch.compile(mixer_core_op, backend='aot_eager', fullgraph=True) \
        if compiled else mixer_core_op
    got = outputs_and_grads(fn, mixer)
    ref = outputs_and_grads(mixer_core_ref, mixer)
    eager = outputs_and_grads(mixer_core_triton, mixer)
    assert max(rel(a, b) for a, b in zip(got, ref)) < TOL
    # the same kernels in the same order: the same bits as the autograd function
    assert bits(got, eager) == 0.0


@pytest.mark.parametrize('fn', [mixer_core_triton, mixer_core_op], ids=['eager', 'op'])
def test_the_backward_keeps_no_conv_output(mixer, fn):
    """What the backward keeps: the projection, the scan output y2 (batch, seqlen,
    ndir, d_inner), the norm's rstd (batch * seqlen, ndir, ngroups), out_proj's
    weight and the parameters; not the conv output (the backward recomputes it)."""
    s = mixer.spec
    u = torch.randn(2, 24, 32)
    flat_numel = sum(p.numel() for p in mixer.parameters()
                     if p is not mixer.in_proj.weight and p is not mixer.in_proj.bias
                     and p is not mixer.out_proj.bias)
    zxbcdt = mixer.in_proj(u).detach().requires_grad_()
    kept = zxbcdt.numel() + 2 * 24 * s.ndir * (s.d_inner + s.ngroups) + flat_numel
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(zxbcdt, mixer.core_params(), s)
    assert sum(saved) == kept


def test_opcheck_accepts_the_op(mixer):
    """The op's schema, fake kernel and autograd registration, as torch.library
    checks them (opcheck raises on a fault)."""
    zxbcdt = mixer.in_proj(torch.randn(2, 24, 32)).detach().requires_grad_()
    cp = mixer.core_params()
    flat = [*cp.conv_w, *cp.conv_b, *cp.dt_bias, *cp.A_log, *cp.D, *cp.norm_w]
    s = mixer.spec
    torch.library.opcheck(torch.ops.mmdinomamba.mixer_core_fwd,
                          (zxbcdt, cp.out_w, cp.out_b, flat, s.d_inner, s.ngroups,
                           s.d_state, s.headdim, s.ndir, s.eps, True),
                          test_utils=('test_schema', 'test_faketensor',
                                      'test_autograd_registration'))
