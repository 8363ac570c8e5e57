"""Fused norms (Triton): the mixer's gated RMSNorm + direction average, and the
block's residual add + RMSNorm.

Gated norm, per token, per norm group of ``group`` channels, for each direction d::

    v_d = y_d * silu(z)
    out = mean_d( v_d / sqrt(mean(v_d^2) + eps) * w_d )

Add + norm, per token of sample b, with ``s_b`` the sample's stochastic-depth
factor (0 or 1 / keep; 1 without drop path)::

    residual = s_b h + residual        (float32)
    out      = residual / sqrt(mean(residual^2) + eps) * w

For the backward the add + norm keeps the float32 residual, or, when ``out`` is in
half precision (autocast), the normalised rows ``residual / sqrt(...)`` in that
dtype: half the bytes (a DinoVim-B DINO step keeps one per block, 1.2 GiB in fp32),
range-safe (each entry is at most sqrt(dim) in magnitude), and rounded as the normed
output that in_proj's weight gradient reads is.
"""
import functools

import torch
import triton
import triton.language as tl

from .launch import cast, cdiv, launch, next_power_of_2

from .conv import row_align

Tensor = torch.Tensor

# Rows per program of the backward kernels (each program also writes a partial
# weight gradient), and rows whose loads are in flight at once (Triton's loop
# pipelining; one row at a time leaves the gated-norm backward bound by the latency
# of its loads); the gated-norm forward keeps one row a program. Chosen by
# measurement: benchmarks/README.md, "Kernel tuning".
GATED_NORM_ROWS = 16
GATED_NORM_STAGES = 3
ADD_NORM_ROWS = 32


# --------------------------------------------------------------------------- #
# Gated RMSNorm of both directions, averaged
# --------------------------------------------------------------------------- #
@triton.jit
def _gated_norm_fwd_kernel(y_ptr, z_ptr, w_ptr, out_ptr, rstd_ptr, eps,
                           s_yr, s_yd, s_zr, s_or,
                           DIM: tl.constexpr, GROUP: tl.constexpr, NGROUPS: tl.constexpr,
                           NDIR: tl.constexpr, BLOCK_G: tl.constexpr,
                           BLOCK_S: tl.constexpr, ROW_ALIGN: tl.constexpr):
    s_yr = s_yr * ROW_ALIGN
    s_yd = s_yd * ROW_ALIGN
    s_zr = s_zr * ROW_ALIGN
    s_or = s_or * ROW_ALIGN
    row = tl.program_id(0).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    offs_s = tl.arange(0, BLOCK_S)
    cols = offs_g[:, None] * GROUP + offs_s[None, :]
    mask = (offs_g < NGROUPS)[:, None] & (offs_s < GROUP)[None, :]
    z = tl.load(z_ptr + row * s_zr + cols, mask=mask, other=0.).to(tl.float32)
    gate = z * tl.sigmoid(z)
    acc = tl.zeros((BLOCK_G, BLOCK_S), dtype=tl.float32)
    for d in tl.static_range(NDIR):
        y = tl.load(y_ptr + row * s_yr + d * s_yd + cols, mask=mask,
                    other=0.).to(tl.float32)
        v = y * gate
        rstd = 1. / tl.sqrt(tl.sum(v * v, 1) / GROUP + eps)
        tl.store(rstd_ptr + (row * NDIR + d) * NGROUPS + offs_g, rstd,
                 mask=offs_g < NGROUPS)
        w = tl.load(w_ptr + d * DIM + cols, mask=mask, other=0.)
        acc += v * rstd[:, None] * w
    tl.store(out_ptr + row * s_or + cols, (acc / NDIR).to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _gated_norm_bwd_kernel(dout_ptr, y_ptr, z_ptr, w_ptr, rstd_ptr, dy_ptr, dz_ptr,
                           dw_ptr, out_ptr, nrows, s_dor, s_yr, s_yd, s_zr, s_dzr, s_or,
                           DIM: tl.constexpr, GROUP: tl.constexpr,
                           NGROUPS: tl.constexpr, NDIR: tl.constexpr,
                           BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
                           ROWS: tl.constexpr, ROW_ALIGN: tl.constexpr,
                           HAS_OUT: tl.constexpr, STAGES: tl.constexpr):
    """HAS_OUT: also write the forward's output again (recomputed, not stored).
    STAGES: rows whose loads are in flight at once (Triton's loop pipelining)."""
    s_dor = s_dor * ROW_ALIGN
    s_or = s_or * ROW_ALIGN
    s_yr = s_yr * ROW_ALIGN
    s_yd = s_yd * ROW_ALIGN
    s_zr = s_zr * ROW_ALIGN
    s_dzr = s_dzr * ROW_ALIGN
    pid = tl.program_id(0)
    offs_g = tl.arange(0, BLOCK_G)
    offs_s = tl.arange(0, BLOCK_S)
    cols = offs_g[:, None] * GROUP + offs_s[None, :]
    cmask = (offs_g < NGROUPS)[:, None] & (offs_s < GROUP)[None, :]
    w0 = tl.load(w_ptr + cols, mask=cmask, other=0.)
    w1 = tl.load(w_ptr + (NDIR - 1) * DIM + cols, mask=cmask, other=0.)
    dw0 = tl.zeros((BLOCK_G, BLOCK_S), dtype=tl.float32)
    dw1 = tl.zeros((BLOCK_G, BLOCK_S), dtype=tl.float32)
    for i in tl.range(0, ROWS, num_stages=STAGES):
        row = (pid * ROWS + i).to(tl.int64)
        mask = cmask & (row < nrows)
        dout = tl.load(dout_ptr + row * s_dor + cols, mask=mask,
                       other=0.).to(tl.float32) / NDIR
        z = tl.load(z_ptr + row * s_zr + cols, mask=mask, other=0.).to(tl.float32)
        sig = tl.sigmoid(z)
        gate = z * sig
        dgate = sig * (1. + z * (1. - sig))
        dz = tl.zeros((BLOCK_G, BLOCK_S), dtype=tl.float32)
        out = tl.zeros((BLOCK_G, BLOCK_S), dtype=tl.float32)
        for d in tl.static_range(NDIR):
            y = tl.load(y_ptr + row * s_yr + d * s_yd + cols, mask=mask,
                        other=0.).to(tl.float32)
            rstd = tl.load(rstd_ptr + (row * NDIR + d) * NGROUPS + offs_g,
                           mask=(offs_g < NGROUPS) & (row < nrows), other=0.)
            n = y * gate * rstd[:, None]
            if d == 0:
                wd = w0
                dw0 += dout * n
            else:
                wd = w1
                dw1 += dout * n
            dn = dout * wd
            if HAS_OUT:
                out += n * wd
            dv = rstd[:, None] * (dn - n * (tl.sum(dn * n, 1) / GROUP)[:, None])
            tl.store(dy_ptr + row * s_yr + d * s_yd + cols,
                     (dv * gate).to(dy_ptr.dtype.element_ty), mask=mask)
            dz += dv * y * dgate
        tl.store(dz_ptr + row * s_dzr + cols, dz.to(dz_ptr.dtype.element_ty), mask=mask)
        if HAS_OUT:
            tl.store(out_ptr + row * s_or + cols, (out / NDIR).to(out_ptr.dtype.element_ty),
                     mask=mask)
    tl.store(dw_ptr + pid * NDIR * DIM + cols, dw0, mask=cmask)
    if NDIR == 2:
        tl.store(dw_ptr + (pid * NDIR + 1) * DIM + cols, dw1, mask=cmask)


@functools.lru_cache(maxsize=None)
def _norm_blocks(dim: int, ngroups: int):
    """The gated norms' compile-time sizes (one shared dict per size: read only)."""
    group = dim // ngroups
    return dict(DIM=dim, GROUP=group, NGROUPS=ngroups,
                BLOCK_G=next_power_of_2(ngroups),
                BLOCK_S=next_power_of_2(group))


def gated_norm_forward(y: Tensor, z: Tensor, weight: Tensor, eps: float, ngroups: int,
                       out: Tensor):
    """Forward of the averaged gated norm.

    Args:
        y (Tensor): (rows, ndir, dim), last axis dense.
        z (Tensor): (rows, dim), last axis dense (a slice is fine).
        weight (Tensor): (ndir, dim) float32, contiguous.
        eps (float): RMSNorm eps.
        ngroups (int): norm groups.
        out (Tensor): (rows, dim), written.

    Returns:
        tuple: ``out`` and rstd (rows, ndir, ngroups) float32.
    """
    rows, ndir, dim = y.shape
    rstd = torch.empty(rows, ndir, ngroups, device=y.device, dtype=torch.float32)
    blocks = _norm_blocks(dim, ngroups)
    strides = (y.stride(0), y.stride(1), z.stride(0), out.stride(0))
    align = row_align(y.element_size(), *strides)
    launch(_gated_norm_fwd_kernel)[(rows, )](
        y, z, weight, out, rstd, eps, *[s // align for s in strides], NDIR=ndir,
        ROW_ALIGN=align, num_warps=_warps(blocks), **blocks)
    return out, rstd


def gated_norm_backward(dout: Tensor, y: Tensor, z: Tensor, weight: Tensor,
                        rstd: Tensor, dy: Tensor, dz: Tensor, out=None) -> Tensor:
    """Backward of :func:`gated_norm_forward`; writes ``dy`` (like y) and ``dz``
    (like z), and the forward's output again into ``out`` (rows, dim) if given,
    and returns the weight gradient (ndir, dim) float32."""
    rows, ndir, dim = y.shape
    ngroups = rstd.shape[-1]
    blocks = _norm_blocks(dim, ngroups)
    programs = cdiv(rows, GATED_NORM_ROWS)
    dw = torch.empty(programs, ndir, dim, device=y.device, dtype=torch.float32)
    strides = (dout.stride(0), y.stride(0), y.stride(1), z.stride(0), dz.stride(0),
               out.stride(0) if out is not None else dz.stride(0))
    align = row_align(y.element_size(), *strides)
    launch(_gated_norm_bwd_kernel)[(programs, )](
        dout, y, z, weight, rstd, dy, dz, dw, out if out is not None else dz, rows,
        *[s // align for s in strides], NDIR=ndir, ROWS=GATED_NORM_ROWS,
        ROW_ALIGN=align, HAS_OUT=out is not None, STAGES=GATED_NORM_STAGES,
        num_warps=_warps(blocks), **blocks)
    return dw.sum(0)


def _warps(blocks) -> int:
    return max(1, min(16, blocks['BLOCK_G'] * blocks['BLOCK_S'] // 256))


# --------------------------------------------------------------------------- #
# Residual add + RMSNorm
# --------------------------------------------------------------------------- #
@triton.jit
def _add_norm_fwd_kernel(h_ptr, res_ptr, scale_ptr, w_ptr, res_out_ptr, out_ptr, rstd_ptr,
                         n_ptr, eps, seqlen, DIM: tl.constexpr, BLOCK: tl.constexpr,
                         HAS_RESIDUAL: tl.constexpr, HAS_SCALE: tl.constexpr,
                         SAVE_NORMED: tl.constexpr):
    """SAVE_NORMED: also write ``n = x * rstd`` (before the weight) in n's dtype, for
    the backward to read instead of the float32 residual."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < DIM
    x = tl.load(h_ptr + row * DIM + cols, mask=mask, other=0.).to(tl.float32)
    if HAS_SCALE:
        x *= tl.load(scale_ptr + row // seqlen)
    if HAS_RESIDUAL:
        x += tl.load(res_ptr + row * DIM + cols, mask=mask, other=0.)
    tl.store(res_out_ptr + row * DIM + cols, x, mask=mask)
    rstd = 1. / tl.sqrt(tl.sum(x * x, 0) / DIM + eps)
    tl.store(rstd_ptr + row, rstd)
    w = tl.load(w_ptr + cols, mask=mask, other=0.).to(tl.float32)
    tl.store(out_ptr + row * DIM + cols, (x * rstd * w).to(out_ptr.dtype.element_ty),
             mask=mask)
    if SAVE_NORMED:
        tl.store(n_ptr + row * DIM + cols, (x * rstd).to(n_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def _add_norm_bwd_kernel(dout_ptr, dres_ptr, saved_ptr, w_ptr, rstd_ptr, scale_ptr,
                         dx_ptr, dh_ptr, dw_ptr, nrows, seqlen, DIM: tl.constexpr,
                         BLOCK: tl.constexpr, HAS_DRES: tl.constexpr,
                         HAS_SCALE: tl.constexpr, SAVED_NORMED: tl.constexpr,
                         ROWS: tl.constexpr):
    """dx: gradient of the residual input (float32); dh = s_b dx in h's dtype.
    ``saved`` is the float32 residual x, or with SAVED_NORMED ``n = x * rstd``."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < DIM
    w = tl.load(w_ptr + cols, mask=cmask, other=0.).to(tl.float32)
    dw = tl.zeros((BLOCK, ), dtype=tl.float32)
    for i in range(0, ROWS):
        row = (pid * ROWS + i).to(tl.int64)
        mask = cmask & (row < nrows)
        saved = tl.load(saved_ptr + row * DIM + cols, mask=mask,
                        other=0.).to(tl.float32)
        rstd = tl.load(rstd_ptr + row, mask=row < nrows, other=0.)
        dout = tl.load(dout_ptr + row * DIM + cols, mask=mask, other=0.).to(tl.float32)
        n = saved if SAVED_NORMED else saved * rstd
        dn = dout * w
        dw += dout * n
        dx = rstd * (dn - n * (tl.sum(dn * n, 0) / DIM))
        if HAS_DRES:
            dx += tl.load(dres_ptr + row * DIM + cols, mask=mask, other=0.)
        tl.store(dx_ptr + row * DIM + cols, dx, mask=mask)
        if HAS_SCALE:
            dx *= tl.load(scale_ptr + row // seqlen, mask=row < nrows, other=0.)
        tl.store(dh_ptr + row * DIM + cols, dx.to(dh_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_ptr + pid * DIM + cols, dw, mask=cmask)


def _add_norm_forward(h: Tensor, residual, weight: Tensor, eps: float,
                      out_dtype: torch.dtype, scale, save_normed: bool):
    """The add + norm kernel: the new residual (rows, dim) float32, the normed rows
    in ``out_dtype``, their rstd (rows,) and, with ``save_normed``, the normed rows
    again in ``out_dtype`` (what the backward reads), else None."""
    dim = h.shape[-1]
    h2 = h.contiguous().view(-1, dim)
    res2 = residual.contiguous().view(-1, dim) if residual is not None else None
    rows = h2.shape[0]
    seqlen = rows // h.shape[0] if h.dim() > 1 else 1
    res_out = torch.empty(rows, dim, device=h.device, dtype=torch.float32)
    out = torch.empty(rows, dim, device=h.device, dtype=out_dtype)
    rstd = torch.empty(rows, device=h.device, dtype=torch.float32)
    normed = torch.empty_like(out) if save_normed else None
    block = next_power_of_2(dim)
    launch(_add_norm_fwd_kernel)[(rows, )](
        h2, res2 if res2 is not None else h2, scale if scale is not None else rstd,
        weight, res_out, out, rstd, normed if save_normed else rstd, eps, seqlen,
        DIM=dim, BLOCK=block, HAS_RESIDUAL=res2 is not None,
        HAS_SCALE=scale is not None, SAVE_NORMED=save_normed,
        num_warps=max(1, min(8, block // 256)))
    return res_out, out, rstd, normed, seqlen


def _add_norm_backward(dout, dres_out, saved: Tensor, weight: Tensor, rstd: Tensor,
                       scale, h_dtype: torch.dtype, seqlen: int, saved_normed: bool):
    """The add + norm kernel's backward: the gradients of the input residual (rows,
    dim) float32 and of ``h`` (rows, dim) in ``h_dtype``, and the weight's (dim,)
    float32, from the gradients of the output (``dout``, the normed rows) and of the
    new residual (``dres_out``); either may be None (zero). ``saved`` is what the
    forward kept (:func:`_add_norm_forward`): the float32 residual, or with
    ``saved_normed`` the normalised rows."""
    rows, dim = saved.shape
    dx = torch.empty(rows, dim, device=saved.device, dtype=torch.float32)
    dh = torch.empty(rows, dim, device=saved.device, dtype=h_dtype)
    programs = cdiv(rows, ADD_NORM_ROWS)
    dw = torch.empty(programs, dim, device=saved.device, dtype=torch.float32)
    if dout is None:
        dout = torch.zeros(rows, dim, device=saved.device, dtype=torch.float32)
    block = next_power_of_2(dim)
    launch(_add_norm_bwd_kernel)[(programs, )](
        dout.contiguous(), dres_out.contiguous() if dres_out is not None else dx,
        saved, weight, rstd, scale if scale is not None else rstd, dx, dh, dw,
        rows, seqlen, DIM=dim, BLOCK=block, HAS_DRES=dres_out is not None,
        HAS_SCALE=scale is not None, SAVED_NORMED=saved_normed, ROWS=ADD_NORM_ROWS,
        num_warps=max(1, min(8, block // 256)))
    return dx, dh, dw.sum(0)


class _AddRMSNorm(torch.autograd.Function):

    @staticmethod
    def forward(ctx, h, residual, weight, eps, out_dtype, scale):
        # a half-precision output (autocast): the backward reads the normalised rows
        # in that dtype (bounded by sqrt(dim), half the bytes of the float32
        # residual), as in_proj's weight gradient reads the normed output
        save_normed = out_dtype in (torch.float16, torch.bfloat16)
        res_out, out, rstd, normed, seqlen = _add_norm_forward(
            h, residual, weight, eps, out_dtype, scale, save_normed)
        ctx.save_for_backward(normed if save_normed else res_out, weight, rstd, scale)
        ctx.meta = (h.dtype, residual is not None, weight.dtype, h.shape, seqlen,
                    save_normed)
        return res_out.view(h.shape), out.view(h.shape)

    @staticmethod
    def backward(ctx, dres_out, dout):
        saved, weight, rstd, scale = ctx.saved_tensors
        h_dtype, has_residual, w_dtype, shape, seqlen, saved_normed = ctx.meta
        dx, dh, dw = _add_norm_backward(dout, dres_out, saved, weight, rstd, scale,
                                        h_dtype, seqlen, saved_normed)
        return (dh.view(shape), dx.view(shape) if has_residual else None,
                cast(dw, w_dtype), None, None, None)


def add_rms_norm_triton(h: Tensor, residual, weight: Tensor, eps: float,
                        out_dtype: torch.dtype, scale=None):
    """``residual = scale * h + residual`` (float32) and its RMSNorm, in one kernel.

    Args:
        h (Tensor): (batch, ..., dim).
        residual (Tensor, optional): like h, float32; None means zero.
        weight (Tensor): (dim,).
        eps (float): RMSNorm eps.
        out_dtype (torch.dtype): dtype of the normed output.
        scale (Tensor, optional): (batch,) float32 per-sample factor of h
            (stochastic depth); None means 1.

    Returns:
        tuple: the new residual (..., dim) float32 and the normed (..., dim).
    """
    if scale is not None:
        scale = scale.float().contiguous()
    if not torch.is_grad_enabled():  # no graph to record: the forward alone
        res_out, out, *_ = _add_norm_forward(h, residual, weight, eps, out_dtype, scale,
                                             save_normed=False)
        return res_out.view(h.shape), out.view(h.shape)
    return _AddRMSNorm.apply(h, residual, weight, eps, out_dtype, scale)
