"""A residual add + LayerNorm (Triton), forward and backward.

Per row of width ``dim``, statistics in float32::

    r    = x + h                        (rounded to the residual's dtype)
    mu   = sum(r) / dim
    rstd = 1 / sqrt(sum((r - mu)^2) / dim + eps)
    n    = (r - mu) * rstd
    out  = n * w + b                    (in the output's dtype)

Backward, with ``g = dout * w`` and ``dres`` the gradient of the residual output
(zero when it is not used)::

    dr = rstd * (g - mean(g) - n * mean(g * n)) + dres    (x's and h's gradient)
    dw = sum over rows of dout * n
    db = sum over rows of dout

The backward recomputes ``n`` from the saved residual and the row's mu and rstd (the
residual is the stream the block passes on, alive anyway). Each program holds a tile
of rows (a power of two, :data:`LN_TILE` elements with the width padded to a power
of two, masked); a backward program runs up to :data:`LN_BWD_TILES` tiles and writes
partial weight and bias gradients, summed afterwards.
"""
import functools
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .launch import cast, cdiv, launch, next_power_of_2
from .ssd_common import sm_count

Tensor = torch.Tensor

# Elements of one program's tile (rows x the width padded to a power of two); tiles
# per backward program (each writes one partial dw and db): at most LN_BWD_TILES,
# fewer where that would leave under LN_BWD_PROGRAMS_PER_SM programs a multiprocessor
LN_TILE = 4096
LN_BWD_TILES = 8
LN_BWD_PROGRAMS_PER_SM = 2


@triton.jit
def _add_ln_fwd_kernel(x_ptr, h_ptr, w_ptr, b_ptr, res_ptr, out_ptr, stats_ptr, nrows,
                       eps, DIM: tl.constexpr, BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                       HAS_H: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                       SAVE_STATS: tl.constexpr):
    """HAS_H: add h and write the residual; SAVE_STATS: write mu (stats[:nrows]) and
    rstd (stats[nrows:])."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK)
    rmask = rows < nrows
    cmask = cols < DIM
    mask = rmask[:, None] & cmask[None, :]
    offs = rows.to(tl.int64)[:, None] * DIM + cols[None, :]
    r = tl.load(x_ptr + offs, mask=mask, other=0.).to(tl.float32)
    if HAS_H:
        r += tl.load(h_ptr + offs, mask=mask, other=0.).to(tl.float32)
        res = r.to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + offs, res, mask=mask)
        r = res.to(tl.float32)
    mean = tl.sum(r, 1) / DIM
    rc = tl.where(mask, r - mean[:, None], 0.)
    rstd = 1. / tl.sqrt(tl.sum(rc * rc, 1) / DIM + eps)
    y = rc * rstd[:, None]
    if HAS_W:
        y *= tl.load(w_ptr + cols, mask=cmask, other=0.).to(tl.float32)[None, :]
    if HAS_B:
        y += tl.load(b_ptr + cols, mask=cmask, other=0.).to(tl.float32)[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)
    if SAVE_STATS:
        tl.store(stats_ptr + rows, mean, mask=rmask)
        tl.store(stats_ptr + nrows + rows, rstd, mask=rmask)


@triton.jit
def _add_ln_bwd_kernel(dout_ptr, dres_ptr, res_ptr, w_ptr, stats_ptr, dr_ptr, dwb_ptr,
                       nrows, tiles, DIM: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCK_M: tl.constexpr, HAS_DRES: tl.constexpr,
                       HAS_W: tl.constexpr, DW: tl.constexpr, DB: tl.constexpr):
    """dr: the gradient of the residual (x's and h's), in the residual's dtype; DW /
    DB: write this program's partial weight / bias gradient (rows ``pid`` and
    ``programs + pid`` of dwb). Each program runs ``tiles`` tiles of rows."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < DIM
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.).to(tl.float32)[None, :]
    dw = tl.zeros((BLOCK_M, BLOCK), dtype=tl.float32)
    db = tl.zeros((BLOCK_M, BLOCK), dtype=tl.float32)
    for t in range(0, tiles):
        rows = (pid * tiles + t) * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < nrows
        mask = rmask[:, None] & cmask[None, :]
        offs = rows.to(tl.int64)[:, None] * DIM + cols[None, :]
        r = tl.load(res_ptr + offs, mask=mask, other=0.).to(tl.float32)
        mean = tl.load(stats_ptr + rows, mask=rmask, other=0.)
        rstd = tl.load(stats_ptr + nrows + rows, mask=rmask, other=0.)
        n = tl.where(mask, (r - mean[:, None]) * rstd[:, None], 0.)
        dout = tl.load(dout_ptr + offs, mask=mask, other=0.).to(tl.float32)
        if HAS_W:
            g = dout * w
        else:
            g = dout
        dr = rstd[:, None] * (g - (tl.sum(g, 1) / DIM)[:, None]
                              - n * (tl.sum(g * n, 1) / DIM)[:, None])
        if HAS_DRES:
            dr += tl.load(dres_ptr + offs, mask=mask, other=0.).to(tl.float32)
        tl.store(dr_ptr + offs, dr.to(dr_ptr.dtype.element_ty), mask=mask)
        if DW:
            dw += dout * n
        if DB:
            db += dout
    if DW:
        tl.store(dwb_ptr + pid * DIM + cols, tl.sum(dw, 0), mask=cmask)
    if DB:
        tl.store(dwb_ptr + (tl.num_programs(0) + pid) * DIM + cols, tl.sum(db, 0),
                 mask=cmask)


@functools.lru_cache(maxsize=None)
def _ln_blocks(dim: int):
    """The compile-time sizes for a width (one shared dict per width: read only)."""
    block = next_power_of_2(dim)
    block_m = max(1, LN_TILE // block)
    return dict(DIM=dim, BLOCK=block, BLOCK_M=block_m,
                num_warps=max(1, min(16, block_m * block // 512)))


def _dense(t: Tensor) -> Tensor:
    """``t`` with its elements dense in row-major order (itself when they are)."""
    return t if t.is_contiguous() else t.contiguous()


def residual_dtype(x: Tensor, h: Optional[Tensor]) -> torch.dtype:
    """The dtype of ``x + h`` (x's without h)."""
    if h is None or h.dtype == x.dtype:
        return x.dtype
    return torch.promote_types(x.dtype, h.dtype)


def add_layer_norm_forward(x: Tensor, h, weight, bias, eps: float,
                           out_dtype: torch.dtype, save_stats: bool):
    """The forward kernel. Every tensor keeps x's shape (the kernel reads them as
    dense rows): few torch operators per call.

    Args:
        x (Tensor): (..., dim).
        h (Tensor, optional): like x.
        weight, bias (Tensor, optional): (dim,).
        eps (float): LayerNorm eps.
        out_dtype (torch.dtype): dtype of the normalised rows.
        save_stats (bool): also return mu and rstd, as one (2 * rows,) float32.

    Returns:
        tuple: the residual (..., dim) in the dtype of ``x + h`` (x made dense when
        h is None), the normalised rows (..., dim) in ``out_dtype``, and mu then
        rstd (None without ``save_stats``).
    """
    dim = x.shape[-1]
    rows = x.numel() // dim
    x = _dense(x)
    res = x if h is None else torch.empty(x.shape, device=x.device,
                                          dtype=residual_dtype(x, h))
    out = torch.empty(x.shape, device=x.device, dtype=out_dtype)
    stats = torch.empty(2 * rows, device=x.device, dtype=torch.float32) \
        if save_stats else None
    blocks = _ln_blocks(dim)
    launch(_add_ln_fwd_kernel)[(cdiv(rows, blocks['BLOCK_M']), )](
        x, _dense(h) if h is not None else x, weight if weight is not None else x,
        bias if bias is not None else x, res, out, stats if save_stats else out, rows,
        eps, HAS_H=h is not None, HAS_W=weight is not None, HAS_B=bias is not None,
        SAVE_STATS=save_stats, **blocks)
    return res, out, stats


def add_layer_norm_backward(dout, dres, res: Tensor, weight, stats: Tensor,
                            need_dw: bool, need_db: bool):
    """The backward kernel: from the gradients of the normalised rows (``dout``) and
    of the residual output (``dres``; either may be None, zero), the gradient of the
    residual (its shape and dtype: x's and h's alike), and the weight's and bias's
    (dim,) float32 (None where not needed)."""
    dim = res.shape[-1]
    rows = res.numel() // dim
    blocks = _ln_blocks(dim)
    tiles = cdiv(rows, blocks['BLOCK_M'])
    per_program = max(1, min(LN_BWD_TILES,
                             tiles // (LN_BWD_PROGRAMS_PER_SM * sm_count(res.device))))
    programs = cdiv(tiles, per_program)
    dr = torch.empty_like(res)
    dwb = torch.empty(2, programs, dim, device=res.device, dtype=torch.float32) \
        if need_dw or need_db else None
    if dout is None:
        dout = torch.zeros(res.shape, device=res.device, dtype=torch.float32)
    launch(_add_ln_bwd_kernel)[(programs, )](
        _dense(dout), _dense(dres) if dres is not None else dr, res,
        weight if weight is not None else res, stats, dr, dwb if dwb is not None else dr,
        rows, per_program, HAS_DRES=dres is not None, HAS_W=weight is not None,
        DW=need_dw, DB=need_db, **blocks)
    if dwb is None:
        return dr, None, None
    dw, db = dwb.sum(1).unbind()
    return dr, dw if need_dw else None, db if need_db else None


class _AddLayerNorm(torch.autograd.Function):
    """Returns (residual, out) when h is given, else out alone (the residual is x)."""

    @staticmethod
    def forward(ctx, x, h, weight, bias, eps, out_dtype):
        res, out, stats = add_layer_norm_forward(x, h, weight, bias, eps, out_dtype,
                                                 save_stats=True)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(res, weight, stats)
        ctx.meta = (x.dtype, None if h is None else h.dtype,
                    None if weight is None else weight.dtype,
                    None if bias is None else bias.dtype)
        return out if h is None else (res, out)

    @staticmethod
    def backward(ctx, *grads):
        res, weight, stats = ctx.saved_tensors
        x_dtype, h_dtype, w_dtype, b_dtype = ctx.meta
        dres, dout = grads if h_dtype is not None else (None, grads[0])
        need = ctx.needs_input_grad
        dr, dw, db = add_layer_norm_backward(dout, dres, res, weight, stats,
                                             need_dw=w_dtype is not None and need[2],
                                             need_db=b_dtype is not None and need[3])
        return (cast(dr, x_dtype), None if h_dtype is None else cast(dr, h_dtype),
                None if dw is None else cast(dw, w_dtype),
                None if db is None else cast(db, b_dtype), None, None)


def add_layer_norm_triton(x: Tensor, h: Optional[Tensor] = None,
                          weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                          eps: float = 1e-5, out_dtype: Optional[torch.dtype] = None
                          ) -> Tuple[Tensor, Tensor]:
    """``residual = x + h`` and its LayerNorm, in one kernel
    (:func:`mmdinomamba.ops.norm.add_layer_norm_ref` is the twin).

    Args:
        x (Tensor): (..., dim).
        h (Tensor, optional): like x; None: no add.
        weight, bias (Tensor, optional): (dim,).
        eps (float): LayerNorm eps.
        out_dtype (torch.dtype, optional): dtype of the normalised output.
            Defaults to the residual's.

    Returns:
        tuple: the residual (..., dim) (x itself when h is None) in the dtype of
        ``x + h``, and the LayerNorm (..., dim) in ``out_dtype``.
    """
    if out_dtype is None:
        out_dtype = residual_dtype(x, h)
    if not torch.is_grad_enabled():  # no graph to record: the forward alone
        res, out, _ = add_layer_norm_forward(x, h, weight, bias, eps, out_dtype,
                                             save_stats=False)
        return (x if h is None else res), out
    if h is None:
        return x, _AddLayerNorm.apply(x, None, weight, bias, eps, out_dtype)
    return _AddLayerNorm.apply(x, h, weight, bias, eps, out_dtype)
