"""The SSD mixer after its input projection, as one autograd function.

From the packed projection ``zxbcdt = in_proj(u)`` (order ``[z, x, B, C, dt]``) to
the mixer's output, for one (causal) or two (bidirectional) directions::

    xBC_d = silu(conv_d(xBC))                      (conv.py, both directions, one pass)
    y_d   = ssd_d(x_d, dt, A_d, B_d, C_d, D_d)     (ssd_scan.py, both directions, one launch)
    out   = mean_d(rmsnorm(y_d * silu(z)) * w_d)   (norm.py)
    res   = out_proj(out)

Direction 1 is the official "bimamba v2" backward direction (flip, causal scan,
flip back), computed in sequence order without flips. Memory: the conv outputs
are stored for the backward and ``out`` is not: the gated-norm backward writes it
again just before ``out_proj``'s weight gradient needs it (the conv outputs are
about twice its size; storing them instead of recomputing them saves a conv
pass, and not storing ``out`` keeps the training peak about where it was).
"""
from typing import NamedTuple, Optional

import torch

from .conv import conv_backward, conv_forward
from .norm import gated_norm_backward, gated_norm_forward
from . import ssd_scan
from .ssd_scan import ScanArgs, scan_backward, scan_forward, sum_heads

Tensor = torch.Tensor


class MixerDims(NamedTuple):
    """Sizes of the mixer (see :class:`mmdinomamba.models.mixers.SSDMixer`)."""
    d_inner: int
    ngroups: int
    d_state: int
    headdim: int
    ndir: int
    eps: float


def _views(zxbcdt: Tensor, dims: MixerDims):
    """The z, xBC and dt slices of the packed projection (views, no copies)."""
    di, gn = dims.d_inner, dims.ngroups * dims.d_state
    conv_dim = di + 2 * gn
    return (zxbcdt[..., :di], zxbcdt[..., di:di + conv_dim],
            zxbcdt[..., di + conv_dim:])


def _split_xbc(xbc2: Tensor, dims: MixerDims):
    """x (batch, seqlen, ndir, nheads, headdim) and B, C (batch, seqlen, ndir,
    ngroups, dstate): views of the conv output (or of its gradient)."""
    batch, seqlen, ndir, _ = xbc2.shape
    di, G, N, P = dims.d_inner, dims.ngroups, dims.d_state, dims.headdim
    return (xbc2[..., :di].view(batch, seqlen, ndir, di // P, P),
            xbc2[..., di:di + G * N].view(batch, seqlen, ndir, G, N),
            xbc2[..., di + G * N:].view(batch, seqlen, ndir, G, N))


def _scan_args(xbc2: Tensor, dt: Tensor, dt_bias: Tensor, A: Tensor, D: Tensor,
               dims: MixerDims, chunk: int) -> ScanArgs:
    x, B, C = _split_xbc(xbc2, dims)
    D = D.float()[:, None].expand(-1, dims.headdim).contiguous()
    return ScanArgs(x, B, C, dt, dt_bias.float().contiguous(), A, D, True, chunk)


class _MixerCore(torch.autograd.Function):

    @staticmethod
    def forward(ctx, zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w, out_w, out_b,
                dims):
        zxbcdt = zxbcdt.contiguous()
        batch, seqlen, _ = zxbcdt.shape
        z, xBC, dt = _views(zxbcdt, dims)
        w32 = conv_w.float().contiguous()
        b32 = conv_b.float().contiguous() if conv_b is not None else None
        xbc2 = conv_forward(xBC, w32, b32, zxbcdt.new_empty(
            batch, seqlen, dims.ndir, xBC.shape[-1]))
        A = -torch.exp(A_log.float())
        args = _scan_args(xbc2, dt, dt_bias, A, D, dims, ssd_scan.default_chunk(seqlen))
        y2 = zxbcdt.new_empty(batch, seqlen, dims.ndir, dims.d_inner)
        scan_forward(args, y2.view(args.x.shape))
        out = zxbcdt.new_empty(batch, seqlen, dims.d_inner)
        _, rstd = gated_norm_forward(
            y2.view(-1, dims.ndir, dims.d_inner), z.reshape(-1, dims.d_inner),
            norm_w.float().contiguous(), dims.eps, dims.ngroups,
            out.view(-1, dims.d_inner))
        # out_proj in the compute dtype, as nn.Linear under autocast
        w_c = out_w.to(zxbcdt.dtype)
        b_c = out_b.to(zxbcdt.dtype) if out_b is not None else None
        ctx.save_for_backward(zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w, xbc2,
                              y2, rstd, w_c)
        ctx.dims = dims
        ctx.meta = (out_w.dtype, out_b is not None)
        return torch.nn.functional.linear(out, w_c, b_c)

    @staticmethod
    def backward(ctx, dres):
        (zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w, xbc2, y2, rstd,
         w_c) = ctx.saved_tensors
        dims = ctx.dims
        out_w_dtype, has_out_b = ctx.meta
        batch, seqlen, _ = zxbcdt.shape
        di = dims.d_inner
        z, xBC, dt = _views(zxbcdt, dims)
        w32 = conv_w.float().contiguous()
        b32 = conv_b.float().contiguous() if conv_b is not None else None
        A = -torch.exp(A_log.float())
        args = _scan_args(xbc2, dt, dt_bias, A, D, dims,
                          ssd_scan.default_backward_chunk(seqlen))

        # out_proj: the input gradient, then the norm's output again for the weights
        dres2 = dres.reshape(-1, dres.shape[-1]).to(w_c.dtype)
        dout = dres2 @ w_c
        out = torch.empty_like(dout)
        dzxbcdt = torch.empty_like(zxbcdt)
        dz, dxBC, ddt_raw = _views(dzxbcdt, dims)
        dy2 = torch.empty_like(y2)
        dnorm_w = gated_norm_backward(
            dout, y2.view(-1, dims.ndir, di), z.reshape(-1, di),
            norm_w.float().contiguous(), rstd, dy2.view(-1, dims.ndir, di),
            dz.view(-1, di), out=out)
        dout_w = (dres2.t() @ out).to(out_w_dtype)
        dout_b = dres2.sum(0, dtype=torch.float32).to(out_w_dtype) if has_out_b else None

        dxbc2 = torch.empty_like(xbc2)
        dx_out, dB_out, dC_out = _split_xbc(dxbc2, dims)
        dB, dC, ddt, dA, dbias, dD = scan_backward(args, dy2.view(args.x.shape), dx_out,
                                                   dD_per_slot=True)
        sum_heads(dB, dims.ndir, dims.ngroups, out=dB_out)
        sum_heads(dC, dims.ndir, dims.ngroups, out=dC_out)
        ddt_raw.copy_(ddt.view(batch, seqlen, dims.ndir, -1).sum(2))
        dconv_w, dconv_b = conv_backward(xBC, w32, b32, dxbc2, dxBC)
        dA_log = dA * A
        return (dzxbcdt, dconv_w.to(conv_w.dtype),
                dconv_b.to(conv_b.dtype) if conv_b is not None else None,
                dbias.to(dt_bias.dtype), dA_log.to(A_log.dtype),
                dD.to(D.dtype), dnorm_w.to(norm_w.dtype), dout_w, dout_b, None)


def ssd_mixer_core(zxbcdt: Tensor, conv_w: Tensor, conv_b: Optional[Tensor],
                   dt_bias: Tensor, A_log: Tensor, D: Tensor, norm_w: Tensor,
                   out_w: Tensor, out_b: Optional[Tensor], dims: MixerDims) -> Tensor:
    """Conv, SSD scan and gated norm of every direction, averaged, then ``out_proj``.

    Args:
        zxbcdt (Tensor): (batch, seqlen, 2 * d_inner + 2 * ngroups * d_state + nheads),
            the output of ``in_proj``; its dtype is the compute dtype.
        conv_w (Tensor): (ndir, conv_dim, d_conv) depthwise conv weights.
        conv_b (Tensor, optional): (ndir, conv_dim).
        dt_bias, A_log, D (Tensor): (ndir * nheads,), directions concatenated.
        norm_w (Tensor): (ndir, d_inner) gated-norm weights.
        out_w (Tensor): (dim, d_inner) ``out_proj`` weight.
        out_b (Tensor, optional): (dim,) ``out_proj`` bias.
        dims (MixerDims): sizes.

    Returns:
        Tensor: (batch, seqlen, dim), the mixer's output, in zxbcdt's dtype.
    """
    return _MixerCore.apply(zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w, out_w,
                            out_b, dims)
