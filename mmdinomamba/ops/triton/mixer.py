"""The SSD mixer after its input projection as one autograd function of fused kernels.

:func:`mixer_core_triton` computes :func:`mmdinomamba.ops.mixer.mixer_core_ref`
(same arguments, same function; the equations are in :mod:`mmdinomamba.ops.mixer`)
with every direction in one launch per stage::

    conv.py      both directions' conv + SiLU, one pass over xBC
    ssd_fwd.py   both directions' SSD scans, one launch (direction 1 reads its
                 tokens last to first: no flips)
    norm.py      both gated norms and their average
    out_proj     one matrix product

Memory: the backward keeps the projection (the op's input), the scan output and
the norm's rstd, and recomputes the rest. The conv output (both directions, twice
the size of xBC: a third of what a layer would otherwise keep) is written again by
one conv pass at the start of the backward, and the norm's output by the
gated-norm backward just before ``out_proj``'s weight gradient needs it. Each costs
one memory-bound pass (the DINO step's measured peaks: ``benchmarks/README.md``,
``benchmarks/results/dino_step.csv``).

The per-direction parameters enter the function as the module holds them and are
stacked inside it, where autograd records nothing; their gradients leave as views
of the stacked gradients.

Eager calls go through an autograd function (the least host work per call); under
``torch.compile`` the same forward and backward run as the custom ops
``mmdinomamba::mixer_core_fwd`` / ``mmdinomamba::mixer_core_bwd`` (registered
autograd and fake kernels), so Dynamo traces them without a graph break and CUDA
graphs (``mode='reduce-overhead'``) capture their launches.
"""
from typing import List, Optional, Tuple

import torch

from ..spec import MixerParams, MixerSpec, split_projection
from .conv import conv_backward, conv_forward
from .launch import cast
from .norm import gated_norm_backward, gated_norm_forward
from .ssd_bwd import scan_backward, sum_heads
from .ssd_common import ScanArgs, default_backward_chunk, default_chunk
from .ssd_fwd import scan_forward

Tensor = torch.Tensor


def _split_xbc(xbc2: Tensor, spec: MixerSpec):
    """x (batch, seqlen, ndir, nheads, headdim) and B, C (batch, seqlen, ndir,
    ngroups, dstate): views of the conv output (or of its gradient)."""
    batch, seqlen, ndir, _ = xbc2.shape
    di, G, N, P = spec.d_inner, spec.ngroups, spec.d_state, spec.headdim
    return (xbc2[..., :di].view(batch, seqlen, ndir, di // P, P),
            xbc2[..., di:di + G * N].view(batch, seqlen, ndir, G, N),
            xbc2[..., di + G * N:].view(batch, seqlen, ndir, G, N))


class _Stacked:
    """One call's per-direction parameters stacked on a leading direction axis, in
    the float32 layout the kernels read (a few KB; the backward reuses them).

    All of them are copied by one ``torch.cat`` into one buffer, of which the
    fields are views: one launch per call (the host's work per call is what an
    eager step waits on). The kernels read ``A_log`` and the per-head ``D`` as they
    are (``A = -exp(A_log)`` is computed in them).
    """

    def __init__(self, params: List[Tensor], spec: MixerSpec, has_conv_b: bool):
        ndir, conv_dim, nheads = spec.ndir, spec.conv_dim, spec.nheads
        flat = torch.cat([params[0].reshape(-1), *params[1:]] if ndir == 1 else
                         [params[0].reshape(-1), params[1].reshape(-1), *params[2:]])
        if flat.dtype != torch.float32:
            flat = flat.float()
        d_conv = params[0].shape[-1]
        sizes = ([ndir * conv_dim * d_conv] + [ndir * conv_dim] * has_conv_b
                 + [ndir * nheads] * 3 + [ndir * spec.d_inner])
        parts = list(flat.split_with_sizes(sizes))  # Tensor.split wraps it in Python
        self.conv_w = parts.pop(0).view(ndir, conv_dim, d_conv)
        self.conv_b = parts.pop(0).view(ndir, conv_dim) if has_conv_b else None
        self.dt_bias, self.A_log, self.D, norm_w = parts
        self.norm_w = norm_w.view(ndir, spec.d_inner)

    def scan_args(self, xbc2: Tensor, dt: Tensor, spec: MixerSpec,
                  chunk: int) -> ScanArgs:
        x, B, C = _split_xbc(xbc2, spec)
        return ScanArgs(x, B, C, dt, self.dt_bias, self.A_log, self.D, True, chunk,
                        a_log=True)


def _flat_params(params: MixerParams) -> List[Tensor]:
    return [*params.conv_w, *(params.conv_b or ()), *params.dt_bias, *params.A_log,
            *params.D, *params.norm_w]


def _spec_args(spec: MixerSpec) -> tuple:
    """The sizes of ``spec`` the kernels use, as the custom op's plain arguments."""
    return spec.d_inner, spec.ngroups, spec.d_state, spec.headdim, spec.ndir, spec.eps


def _conv(xBC: Tensor, p: _Stacked, spec: MixerSpec) -> Tensor:
    """Both directions' conv + SiLU: (batch, seqlen, ndir, conv_dim), xBC's dtype."""
    batch, seqlen, _ = xBC.shape
    return conv_forward(xBC, p.conv_w, p.conv_b,
                        xBC.new_empty(batch, seqlen, spec.ndir, spec.conv_dim))


def _core_forward(zxbcdt: Tensor, out_w: Tensor, out_b: Optional[Tensor],
                  params: List[Tensor], spec: MixerSpec, has_conv_b: bool):
    """The forward of a contiguous ``zxbcdt``: the result (batch, seqlen, dim), what
    the backward reads besides zxbcdt (the scan output y2 and the norm's rstd), and
    what it can reuse (the stacked parameters, and ``w_c``: out_w in the compute
    dtype, zxbcdt's)."""
    p = _Stacked(params, spec, has_conv_b)
    w_c = cast(out_w, zxbcdt.dtype)
    batch, seqlen, _ = zxbcdt.shape
    ndir, di = spec.ndir, spec.d_inner
    z, xBC, dt = split_projection(zxbcdt, spec)
    xbc2 = _conv(xBC, p, spec)
    args = p.scan_args(xbc2, dt, spec, default_chunk(seqlen))
    y2 = zxbcdt.new_empty(batch, seqlen, ndir, di)
    scan_forward(args, y2.view(args.x.shape))
    out = zxbcdt.new_empty(batch, seqlen, di)
    _, rstd = gated_norm_forward(y2.view(-1, ndir, di), z.reshape(-1, di), p.norm_w,
                                 spec.eps, spec.ngroups, out.view(-1, di))
    # out_proj in the compute dtype, as nn.Linear under autocast
    b_c = out_b.to(zxbcdt.dtype) if out_b is not None else None
    res = torch.nn.functional.linear(out, w_c, b_c)
    return res, y2, rstd, p, w_c


def _core_backward(dres: Tensor, zxbcdt: Tensor, y2: Tensor, rstd: Tensor,
                   w_c: Tensor, out_w_dtype: torch.dtype, has_out_b: bool,
                   params: List[Tensor], p: _Stacked, spec: MixerSpec):
    """The gradients of zxbcdt, out_w, out_b (None without a bias) and of the
    per-direction parameters stacked by kind (see :func:`_unstack`); ``w_c`` is
    out_w in the compute dtype."""
    batch, seqlen, _ = zxbcdt.shape
    ndir, di = spec.ndir, spec.d_inner
    z, xBC, dt = split_projection(zxbcdt, spec)
    xbc2 = _conv(xBC, p, spec)  # recomputed: see the module's docstring, "Memory"
    args = p.scan_args(xbc2, dt, spec, default_backward_chunk(seqlen))

    # out_proj: the input gradient, then the norm's output again for the weights
    dres2 = cast(dres.reshape(-1, dres.shape[-1]), w_c.dtype)
    dout = dres2 @ w_c
    out = torch.empty_like(dout)
    dzxbcdt = torch.empty_like(zxbcdt)
    dz, dxBC, ddt_raw = split_projection(dzxbcdt, spec)
    dy2 = torch.empty_like(y2)
    dnorm_w = gated_norm_backward(dout, y2.view(-1, ndir, di), z.reshape(-1, di),
                                  p.norm_w, rstd, dy2.view(-1, ndir, di),
                                  dz.view(-1, di), out=out)
    dout_w = (dres2.t() @ out).to(out_w_dtype)
    dout_b = dres2.sum(0, dtype=torch.float32).to(out_w_dtype) if has_out_b else None

    dxbc2 = torch.empty_like(xbc2)
    dx_out = dxbc2[..., :di].view(args.x.shape)  # x's gradient (B's and C's below)
    dBC = xbc2.new_empty(2, batch, seqlen, args.nslots, spec.d_state)
    _, _, ddt, dA_log, dbias, dD = scan_backward(  # the kernels read A_log: its dA
        args, dy2.view(args.x.shape), dx_out, dD_per_slot=True, dBC=dBC)
    # dB and dC summed over each group's heads in one reduction, into the gradient
    # of the conv output: its [B, C] columns viewed as (2, batch, seqlen, ndir, G, N)
    G, N = spec.ngroups, spec.d_state
    sum_heads(dBC, ndir, G, out=dxbc2[..., di:].view(batch, seqlen, ndir, 2, G, N)
              .permute(3, 0, 1, 2, 4, 5))
    # dt is shared by the directions: the sum of theirs, computed in float32 and
    # rounded once into the gradient's dtype (one launch; a sum, then a copy, took two)
    ddt4 = ddt.view(batch, seqlen, ndir, -1)
    if ndir == 2:
        torch.add(ddt4[:, :, 0], ddt4[:, :, 1], out=ddt_raw)
    else:
        ddt_raw.copy_(ddt4[:, :, 0])
    dconv_w, dconv_b = conv_backward(xBC, p.conv_w, p.conv_b, dxbc2, dxBC)
    stacked = [dconv_w, dconv_b, dbias, dA_log, dD, dnorm_w]
    return dzxbcdt, dout_w, dout_b, stacked


def _unstack(stacked: List[Optional[Tensor]], params: List[Tensor]) -> List[Tensor]:
    """Per-direction gradients, in the parameters' order and dtypes, from the stacked
    ones (dconv_w, dconv_b or None, dt_bias, A_log, D, norm_w)."""
    dconv_w, dconv_b, *per_head, dnorm_w = stacked
    ndir = dnorm_w.shape[0]
    grads = [*dconv_w.view(ndir, *params[0].shape).unbind(0)]
    if dconv_b is not None:
        grads += dconv_b.unbind(0)
    for g in per_head:  # (ndir * nheads,): one split, no view
        grads += g.split_with_sizes((g.shape[0] // ndir, ) * ndir)
    grads += dnorm_w.unbind(0)
    return [cast(g, q.dtype) for g, q in zip(grads, params)]


class _MixerCore(torch.autograd.Function):
    """The eager path: the least host work per call (the custom op below goes through
    the dispatcher twice more)."""

    @staticmethod
    def forward(ctx, zxbcdt, out_w, out_b, spec, has_conv_b, *params):
        zxbcdt = zxbcdt.contiguous()
        res, y2, rstd, p, w_c = _core_forward(zxbcdt, out_w, out_b, params, spec,
                                              has_conv_b)
        ctx.save_for_backward(zxbcdt, y2, rstd, w_c, *params)
        ctx.stacked = p
        ctx.spec = spec
        ctx.meta = (out_w.dtype, out_b is not None)
        return res

    @staticmethod
    def backward(ctx, dres):
        zxbcdt, y2, rstd, w_c, *params = ctx.saved_tensors
        dzxbcdt, dout_w, dout_b, stacked = _core_backward(
            dres, zxbcdt, y2, rstd, w_c, *ctx.meta, params, ctx.stacked, ctx.spec)
        return (dzxbcdt, dout_w, dout_b, None, None, *_unstack(stacked, params))


# --------------------------------------------------------------- torch.compile
# The same forward and backward as custom ops, so that Dynamo sees one opaque node
# per call (no graph break, no tracing into Triton's launcher), AOTAutograd keeps
# y2 and rstd for the backward, and CUDA graphs capture the launches.

@torch.library.custom_op('mmdinomamba::mixer_core_fwd', mutates_args=())
def _op_forward(zxbcdt: Tensor, out_w: Tensor, out_b: Optional[Tensor],
                params: List[Tensor], d_inner: int, ngroups: int, d_state: int,
                headdim: int, ndir: int, eps: float, has_conv_b: bool
                ) -> Tuple[Tensor, Tensor, Tensor]:
    spec = MixerSpec(d_inner, ngroups, d_state, headdim, ndir, eps)
    return _core_forward(zxbcdt.contiguous(), out_w, out_b, params, spec,
                         has_conv_b)[:3]


@_op_forward.register_fake
def _(zxbcdt, out_w, out_b, params, d_inner, ngroups, d_state, headdim, ndir, eps,
      has_conv_b):
    batch, seqlen, _ = zxbcdt.shape
    return (zxbcdt.new_empty(batch, seqlen, out_w.shape[0]),
            zxbcdt.new_empty(batch, seqlen, ndir, d_inner),
            zxbcdt.new_empty(batch * seqlen, ndir, ngroups, dtype=torch.float32))


@torch.library.custom_op('mmdinomamba::mixer_core_bwd', mutates_args=())
def _op_backward(dres: Tensor, zxbcdt: Tensor, y2: Tensor, rstd: Tensor,
                 out_w: Tensor, has_out_b: bool, params: List[Tensor], d_inner: int,
                 ngroups: int, d_state: int, headdim: int, ndir: int, eps: float,
                 has_conv_b: bool) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
    """The gradients, the per-direction ones stacked (:func:`_unstack` splits them
    outside the op: an op returns no views of its outputs); empty tensors stand for
    the missing biases' (an op returns no None)."""
    spec = MixerSpec(d_inner, ngroups, d_state, headdim, ndir, eps)
    p = _Stacked(params, spec, has_conv_b)
    zxbcdt = zxbcdt.contiguous()
    dzxbcdt, dout_w, dout_b, stacked = _core_backward(
        dres, zxbcdt, y2, rstd, out_w.to(zxbcdt.dtype), out_w.dtype, has_out_b,
        params, p, spec)
    empty = out_w.new_empty(0)
    # copies: an op's outputs alias nothing, and the conv's weight and bias
    # gradients are slices of one buffer, the scan's per-head ones of another
    return (dzxbcdt, dout_w, dout_b if has_out_b else empty,
            [empty if g is None else g.clone() for g in stacked])


@_op_backward.register_fake
def _(dres, zxbcdt, y2, rstd, out_w, has_out_b, params, d_inner, ngroups, d_state,
      headdim, ndir, eps, has_conv_b):
    conv_dim = d_inner + 2 * ngroups * d_state
    nheads = d_inner // headdim
    f32 = dict(dtype=torch.float32)
    stacked = [out_w.new_empty(ndir, conv_dim, params[0].shape[-1], **f32),
               out_w.new_empty((ndir, conv_dim) if has_conv_b else (0, ), **f32),
               *(out_w.new_empty(ndir * nheads, **f32) for _ in range(3)),
               out_w.new_empty(ndir, d_inner, **f32)]
    return (torch.empty_like(zxbcdt, memory_format=torch.contiguous_format),
            torch.empty_like(out_w, memory_format=torch.contiguous_format),
            out_w.new_empty(out_w.shape[0] if has_out_b else 0), stacked)


def _op_setup_context(ctx, inputs, output):
    zxbcdt, out_w, out_b, params, *sizes = inputs
    _, y2, rstd = output
    ctx.mark_non_differentiable(y2, rstd)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(zxbcdt, y2, rstd, out_w, *params)
    ctx.has_out_b = out_b is not None
    ctx.has_conv_b = sizes[-1]
    ctx.sizes = sizes


def _op_autograd(ctx, dres, *_):
    zxbcdt, y2, rstd, out_w, *params = ctx.saved_tensors
    dzxbcdt, dout_w, dout_b, stacked = torch.ops.mmdinomamba.mixer_core_bwd(
        dres, zxbcdt, y2, rstd, out_w, ctx.has_out_b, params, *ctx.sizes)
    if not ctx.has_conv_b:
        stacked[1] = None
    return (dzxbcdt, dout_w, dout_b if ctx.has_out_b else None,
            _unstack(stacked, params), *(None, ) * len(ctx.sizes))


torch.library.register_autograd('mmdinomamba::mixer_core_fwd', _op_autograd,
                                setup_context=_op_setup_context)


def mixer_core_op(zxbcdt: Tensor, params: MixerParams, spec: MixerSpec) -> Tensor:
    """:func:`mixer_core_triton` through the custom op ``mmdinomamba::mixer_core_fwd``
    (its backward ``mmdinomamba::mixer_core_bwd``): what ``torch.compile`` traces."""
    res, _, _ = torch.ops.mmdinomamba.mixer_core_fwd(
        zxbcdt, params.out_w, params.out_b, _flat_params(params), *_spec_args(spec),
        params.conv_b is not None)
    return res


def mixer_core_triton(zxbcdt: Tensor, params: MixerParams, spec: MixerSpec) -> Tensor:
    """The mixer after ``in_proj`` in fused Triton kernels (CUDA, ``d_conv = 4``).

    Same arguments and result as :func:`mmdinomamba.ops.mixer.mixer_core_ref`;
    ``spec.chunk_size`` and ``spec.ssd_backend`` do not apply (the kernels are the
    'triton' backend, with tiles of their own).

    Args:
        zxbcdt (Tensor): (batch, seqlen, 2 * d_inner + 2 * ngroups * d_state +
            nheads), the output of ``in_proj``; its dtype is the compute dtype.
        params (MixerParams): the parameters.
        spec (MixerSpec): sizes.

    Returns:
        Tensor: (batch, seqlen, dim), the mixer's output, in zxbcdt's dtype.
    """
    if spec.d_conv != 4:
        raise ValueError(f'mixer_core_triton: the fused conv is written for d_conv=4, '
                         f'got {spec.d_conv}')
    if torch.compiler.is_compiling():
        return mixer_core_op(zxbcdt, params, spec)
    flat, has_conv_b = _flat_params(params), params.conv_b is not None
    if not torch.is_grad_enabled():  # no graph to record: the forward alone
        return _core_forward(zxbcdt.contiguous(), params.out_w, params.out_b, flat, spec,
                             has_conv_b)[0]
    return _MixerCore.apply(zxbcdt, params.out_w, params.out_b, spec, has_conv_b, *flat)
