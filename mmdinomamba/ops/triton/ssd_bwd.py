"""The SSD scan's backward, in two launches.

The first, one program per (slot, image), sweeps the chunks forwards to store the
state entering each chunk, then backwards to store the gradient of the state
leaving each chunk (one matrix product per chunk and sweep). The second, one
program per (slot, image, chunk), computes every gradient of a chunk from those two
states alone, so all chunks run in parallel and no program carries a loop's worth
of live tiles. Gradients of B and C are written per slot and summed over the heads
of a group by :func:`sum_heads`. The equations and the layout are in
``ssd_common.py``.
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .launch import launch
from .ssd_common import (LOG_DECAY_FLOOR, ScanArgs, _chunk_positions, _chunk_steps,
                         _load_chunk, _load_raw, _load_rows, _program_bases,
                         _slot_A, _slot_D, _tile_offsets, block, occupancy_maxnreg,
                         strides)

Tensor = torch.Tensor


@triton.jit
def _ssd_bwd_states_kernel(
        x_ptr, B_ptr, C_ptr, dt_ptr, dt_bias_ptr, A_ptr, dy_ptr, hin_ptr, dout_ptr,
        carry_ptr, seqlen, nheads, heads_per_group, nslots, nchunks,
        s_xb, s_xl, s_xd, s_xh,
        s_Bb, s_Bl, s_Bd, s_Bg,
        s_Cb, s_Cl, s_Cd, s_Cg,
        s_tb, s_tl, s_th,
        s_yb, s_yl, s_yd, s_yh,
        HEADDIM: tl.constexpr, DSTATE: tl.constexpr, CHUNK: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
        A_LOG: tl.constexpr, DOT_PREC: tl.constexpr):
    """Backward pass 1, one program per (slot, image), two sweeps over the chunks.

    Forward sweep: ``hin[c]``, the state entering chunk c. Reverse sweep:
    ``dout[c]``, the gradient of the loss with respect to the state leaving chunk
    c, carried backwards as ``dout[c - 1] = exp(g_last) dout[c] + (dy o exp(g))^T C``,
    and ``carry[c] = sum(dout[c] o hin[c])`` (the gradient of the chunk's total decay
    through the state it carries), with dout still in float32. ``hin[0]`` and
    ``dout[nchunks - 1]`` are zero: they are neither written nor read (masked
    loads give the zeros), which saves a quarter of the state traffic at 4 chunks.
    """
    slot = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    reverse, x_base, B_base, C_base, dt_base, dy_base = _program_bases(
        slot, b, nheads, heads_per_group, x_ptr, B_ptr, C_ptr, dt_ptr, dy_ptr, s_xb,
        s_xd, s_xh, s_Bb, s_Bd, s_Bg, s_Cb, s_Cd, s_Cg, s_tb, s_th, s_yb, s_yd, s_yh)
    offs_q, offs_p, offs_n, mask_p, mask_n, offs_state = _tile_offsets(
        0, CHUNK, BLOCK_P, BLOCK_N, HEADDIM, DSTATE)
    state_base = (b * nslots + slot) * nchunks * BLOCK_P * BLOCK_N
    A = _slot_A(A_ptr, slot, A_LOG)
    bias = tl.load(dt_bias_ptr + slot).to(tl.float32)

    state = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    n_pos, n_valid, n_raw, n_x, n_B, n_C = _load_raw(
        0, seqlen, reverse, dt_base, s_tl, x_base, s_xl, B_base, s_Bl, C_base, s_Cl,
        offs_q, offs_p, offs_n, mask_p, mask_n)
    for c in range(0, nchunks):
        tl.store(hin_ptr + state_base + c * BLOCK_P * BLOCK_N + offs_state,
                 state.to(hin_ptr.dtype.element_ty), mask=(offs_state >= 0) & (c > 0))
        valid, raw, x, Bt = n_valid, n_raw, n_x, n_B
        n_pos, n_valid, n_raw, n_x, n_B, n_C = _load_raw(
            (c + 1) * CHUNK, seqlen, reverse, dt_base, s_tl, x_base, s_xl, B_base, s_Bl,
            C_base, s_Cl, offs_q, offs_p, offs_n, mask_p, mask_n)
        raw, dt, gcs, glast = _chunk_steps(raw, valid, bias, A, DT_SOFTPLUS)
        xdt = x.to(tl.float32) * (dt * tl.exp(glast - gcs))[:, None]
        state = state * tl.exp(glast) + tl.dot(tl.trans(xdt.to(x.dtype)), Bt,
                                               input_precision=DOT_PREC)

    tl.debug_barrier()  # the reverse sweep reads hin written by other threads
    dstate = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    # the same prefetch, of dt, dy, C and hin
    n_valid, n_pos = _chunk_positions((nchunks - 1) * CHUNK, seqlen, reverse, offs_q)
    n_raw = tl.load(dt_base + n_pos * s_tl, mask=n_valid, other=0.)
    n_dy = _load_rows(dy_base, s_yl, n_pos, n_valid, offs_p, mask_p)
    n_C = _load_rows(C_base, s_Cl, n_pos, n_valid, offs_n, mask_n)
    n_h = tl.load(hin_ptr + state_base + (nchunks - 1) * BLOCK_P * BLOCK_N + offs_state,
                  mask=(offs_state >= 0) & (nchunks > 1), other=0.)
    for ci in range(0, nchunks):
        c = nchunks - 1 - ci
        tl.store(dout_ptr + state_base + c * BLOCK_P * BLOCK_N + offs_state,
                 dstate.to(dout_ptr.dtype.element_ty),
                 mask=(offs_state >= 0) & (c < nchunks - 1))
        valid, raw, dy, Ct, h_in = n_valid, n_raw, n_dy, n_C, n_h
        n_valid, n_pos = _chunk_positions((c - 1) * CHUNK, seqlen, reverse, offs_q)
        n_raw = tl.load(dt_base + n_pos * s_tl, mask=n_valid, other=0.)
        n_dy = _load_rows(dy_base, s_yl, n_pos, n_valid, offs_p, mask_p)
        n_C = _load_rows(C_base, s_Cl, n_pos, n_valid, offs_n, mask_n)
        n_h = tl.load(hin_ptr + state_base + (c - 1) * BLOCK_P * BLOCK_N + offs_state,
                      mask=(offs_state >= 0) & (c > 1), other=0.)
        tl.store(carry_ptr + (b * nslots + slot) * nchunks + c,
                 tl.sum(tl.sum(dstate * h_in.to(tl.float32), 1), 0))
        raw, dt, gcs, glast = _chunk_steps(raw, valid, bias, A, DT_SOFTPLUS)
        dye = dy.to(tl.float32) * tl.exp(gcs)[:, None]
        dstate = dstate * tl.exp(glast) + tl.dot(tl.trans(dye.to(dy.dtype)), Ct,
                                                 input_precision=DOT_PREC)


@triton.jit
def _ssd_bwd_chunk_kernel(
        x_ptr, B_ptr, C_ptr, dt_ptr, dt_bias_ptr, A_ptr, D_ptr, dy_ptr, hin_ptr,
        dout_ptr, carry_ptr, dx_ptr, dB_ptr, dC_ptr, ddt_ptr, sums_ptr, dD_ptr,
        seqlen, nheads, heads_per_group, nslots, nchunks, c0, chunk_len,
        s_xb, s_xl, s_xd, s_xh,
        s_Bb, s_Bl, s_Bd, s_Bg,
        s_Cb, s_Cl, s_Cd, s_Cg,
        s_tb, s_tl, s_th,
        s_yb, s_yl, s_yd, s_yh,
        s_gb, s_gl, s_gd, s_gh,
        HEADDIM: tl.constexpr, DSTATE: tl.constexpr, CHUNK: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
        HAS_D: tl.constexpr, D_PER_SLOT: tl.constexpr, A_LOG: tl.constexpr,
        DOT_PREC: tl.constexpr):
    """Backward pass 2, one program per (slot, image, chunk), all independent.

    From the chunk's inputs, ``dy``, and ``hin[c]``, ``dout[c]`` and ``carry[c]``
    (pass 1): dx, and per slot dB, dC, d(raw dt); per chunk the partial sums of dA,
    d(dt_bias) and, with D_PER_SLOT, dD, each a (slots, images, chunks) block of
    ``sums`` (so one reduction sums them all); a per-channel dD's partial sums go to
    ``dD`` (slots, images, chunks, headdim). Chunk c holds the tokens from
    ``c * chunk_len`` (pass 1's chunk length); this launch's chunks start at
    ``c0``, and CHUNK (the tile) may be shorter than chunk_len when the chunks hold
    fewer tokens (the sequence's tail).
    """
    slot = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    c = c0 + tl.program_id(2)
    reverse, x_base, B_base, C_base, dt_base, dy_base = _program_bases(
        slot, b, nheads, heads_per_group, x_ptr, B_ptr, C_ptr, dt_ptr, dy_ptr, s_xb,
        s_xd, s_xh, s_Bb, s_Bd, s_Bg, s_Cb, s_Cd, s_Cg, s_tb, s_th, s_yb, s_yd, s_yh)
    dx_base = dx_ptr + b * s_gb + (slot // nheads) * s_gd + (slot % nheads) * s_gh
    offs_q, offs_p, offs_n, mask_p, mask_n, offs_state = _tile_offsets(
        0, CHUNK, BLOCK_P, BLOCK_N, HEADDIM, DSTATE)
    causal = offs_q[:, None] >= offs_q[None, :]
    row = (b * nslots + slot) * nchunks + c  # (image, slot, chunk): the states
    # (slot, image, chunk): the partial sums, reduced over one contiguous axis
    part = (slot * tl.num_programs(1) + b) * nchunks + c
    parts = nslots * tl.num_programs(1) * nchunks  # one block of `sums`
    A = _slot_A(A_ptr, slot, A_LOG)
    bias = tl.load(dt_bias_ptr + slot).to(tl.float32)

    pos, valid, raw, dt, gcs, glast, x, Bt, Ct = _load_chunk(
        c * chunk_len, seqlen, reverse, dt_base, s_tl, bias, A, x_base, s_xl, B_base,
        s_Bl, C_base, s_Cl, offs_q, offs_p, offs_n, mask_p, mask_n, DT_SOFTPLUS)
    mask_qp = valid[:, None] & mask_p[None, :]
    mask_qn = valid[:, None] & mask_n[None, :]
    dy = tl.load(dy_base + pos[:, None] * s_yl + offs_p[None, :], mask=mask_qp,
                 other=0.)
    h_in = tl.load(hin_ptr + row * BLOCK_P * BLOCK_N + offs_state,
                   mask=(offs_state >= 0) & (c > 0), other=0.)
    dstate = tl.load(dout_ptr + row * BLOCK_P * BLOCK_N + offs_state,
                     mask=(offs_state >= 0) & (c < nchunks - 1), other=0.)
    eg = tl.exp(gcs)
    to_end = tl.exp(glast - gcs)
    xdt = (x.to(tl.float32) * dt[:, None]).to(x.dtype)
    bc_off = ((b * seqlen + pos[:, None]) * nslots + slot) * DSTATE + offs_n[None, :]

    # intra-chunk terms; M = (C B^T) o L, dM = dy X^T
    decay = tl.exp(tl.where(causal, gcs[:, None] - gcs[None, :], -float('inf')))
    Mm = tl.dot(Ct, tl.trans(Bt), input_precision=DOT_PREC) * decay
    dM = tl.dot(dy, tl.trans(xdt), input_precision=DOT_PREC)
    dg = tl.sum(Mm * dM, 1) - tl.sum(Mm * dM, 0)
    dS = (dM * decay).to(x.dtype)
    dX = tl.dot(tl.trans(Mm.to(x.dtype)), dy, input_precision=DOT_PREC)
    # dC = dS B + exp(g) dy H_in
    dyH = tl.dot(dy, h_in.to(x.dtype), input_precision=DOT_PREC)
    dg += eg * tl.sum(Ct.to(tl.float32) * dyH, 1)
    tl.store(dC_ptr + bc_off, tl.dot(dS, Bt, input_precision=DOT_PREC) +
             eg[:, None] * dyH, mask=mask_qn)
    # dB = dS^T C + exp(g_last - g) X dout
    tl.store(dB_ptr + bc_off, tl.dot(tl.trans(dS), Ct, input_precision=DOT_PREC) +
             to_end[:, None] * tl.dot(xdt, dstate.to(x.dtype), input_precision=DOT_PREC),
             mask=mask_qn)
    # dX += exp(g_last - g) (B dout^T)
    GB = tl.dot(Bt, tl.trans(dstate.to(x.dtype)), input_precision=DOT_PREC)
    dX += to_end[:, None] * GB
    term = to_end * tl.sum(xdt.to(tl.float32) * GB, 1)
    at_end = tl.sum(term, 0) + tl.exp(glast) * tl.load(carry_ptr + row)
    dg += tl.where(offs_q == CHUNK - 1, at_end, 0.) - term
    # g = cumsum(a): da_k = sum_{i >= k} dg_i (0 where a_k sits on the floor)
    da = tl.sum(tl.where(offs_q[None, :] >= offs_q[:, None], dg[None, :], 0.), 1)
    da = tl.where(dt * A >= LOG_DECAY_FLOOR, da, 0.)
    ddt = A * da + tl.sum(x.to(tl.float32) * dX, 1)
    dA = tl.sum(dt * da, 0)
    if A_LOG:  # dA_log = dA * dA/dA_log = dA * A
        dA = dA * A
    tl.store(sums_ptr + part, dA)
    dxv = dt[:, None] * dX
    if HAS_D:
        Dv = _slot_D(D_ptr, slot, offs_p, mask_p, HEADDIM, D_PER_SLOT)
        dxv += Dv[None, :] * dy.to(tl.float32)
        dD = tl.sum(x.to(tl.float32) * dy.to(tl.float32), 0)  # 0 off the channels
        if D_PER_SLOT:
            tl.store(sums_ptr + 2 * parts + part, tl.sum(dD, 0))
        else:
            tl.store(dD_ptr + part * HEADDIM + offs_p, dD, mask=mask_p)
    tl.store(dx_base + pos[:, None] * s_gl + offs_p[None, :],
             dxv.to(dx_ptr.dtype.element_ty), mask=mask_qp)
    if DT_SOFTPLUS:
        ddt = ddt * tl.sigmoid(raw)
    ddt = tl.where(valid, ddt, 0.)
    tl.store(sums_ptr + parts + part, tl.sum(ddt, 0))
    tl.store(ddt_ptr + (b * seqlen + pos) * nslots + slot, ddt, mask=valid)



def state_buffers(args: ScanArgs) -> Tuple[Tensor, Tensor]:
    """Uninitialised buffers for the states entering (``hin``) and the gradients
    leaving (``dout``) each chunk: (batch, slots, nchunks, BLOCK_P, BLOCK_N) in x's
    dtype each. Their first and last chunk are never written nor read."""
    const = args.constexprs()
    hin = torch.empty(args.batch, args.nslots, args.nchunks, const['BLOCK_P'],
                      const['BLOCK_N'], device=args.x.device, dtype=args.x.dtype)
    return hin, torch.empty_like(hin)


def scan_backward(args: ScanArgs, dy: Tensor, dx: Tensor, num_warps: int = 4,
                  states_warps: int = 4, maxnreg=None, states_maxnreg='auto',
                  dD_per_slot: bool = False,
                  states: Optional[Tuple[Tensor, Tensor]] = None,
                  dBC: Optional[Tensor] = None):
    """Run the backward kernels: the two state sweeps, then every chunk in parallel.

    Args:
        args (ScanArgs): the forward call.
        dy (Tensor): gradient of y, a 5-d view like ``x``.
        dx (Tensor): written with the gradient of x (5-d view like ``x``).
        num_warps (int): warps per program of the per-chunk kernel.
        states_warps (int): warps per program of the state sweeps.
        maxnreg, states_maxnreg (int, optional): register caps per thread of the
            per-chunk kernel and the state sweeps (None: the compiler's choice;
            'auto': :func:`occupancy_maxnreg`).
        dD_per_slot (bool): return a per-channel D's gradient summed over the
            head's channels too, (slots,). A per-slot D's (one per head, as the
            mixer's) always is.
        states (tuple, optional): the ``(hin, dout)`` work buffers of
            :func:`state_buffers` to use (their contents do not matter); None
            allocates them.
        dBC (Tensor, optional): a (2, batch, seqlen, slots, dstate) buffer in x's
            dtype to write ``dB`` and ``dC`` into (they are returned as its two
            halves), so that one reduction sums both over the heads; None
            allocates one.

    Returns:
        tuple: ``dB``, ``dC`` (batch, seqlen, slots, dstate) in x's dtype, per
        slot, to be summed over the heads of each group by :func:`sum_heads`;
        float32 ``ddt`` (batch, seqlen, slots) of the raw step, ``dA`` and
        ``ddt_bias`` (slots,) and ``dD`` (slots, headdim), or (slots,) for a
        per-slot D or with ``dD_per_slot``, or None, summed over the batch.
    """
    kw = dict(device=args.x.device, dtype=torch.float32)
    batch, seqlen, nslots, nchunks = args.batch, args.seqlen, args.nslots, args.nchunks
    const = args.constexprs()
    hin, dout = states if states is not None else state_buffers(args)
    carry = torch.empty(batch, nslots, nchunks, **kw)
    # per-slot partials in x's dtype: summed over heads (in fp32) into a gradient
    # of that dtype anyway, and half the bytes of fp32 for bf16 inputs
    if dBC is None:
        dBC = torch.empty(2, batch, seqlen, nslots, args.dstate, device=args.x.device,
                          dtype=args.x.dtype)
    dB, dC = dBC
    ddt = torch.empty(batch, seqlen, nslots, **kw)
    # the partial sums of dA, d(dt_bias) and a per-slot dD in one buffer, one
    # reduction; a per-channel dD's in a buffer of their own
    per_slot = const['D_PER_SLOT']
    sums = torch.empty(2 + per_slot, nslots, batch * nchunks, **kw)
    dD = torch.empty(nslots, batch * nchunks, args.headdim, **kw) \
        if args.D is not None and not per_slot else None
    inputs = dict(args.inputs(), dy_ptr=dy, hin_ptr=hin, dout_ptr=dout, carry_ptr=carry,
                  nchunks=nchunks, **strides('y', dy))
    if states_maxnreg == 'auto':
        states_maxnreg = occupancy_maxnreg(nslots * batch, dy.device)
    launch(_ssd_bwd_states_kernel)[(nslots, batch)](
        **inputs, num_warps=states_warps, maxnreg=states_maxnreg,
        **args.constexprs_without_D())
    # every chunk in parallel; a short last chunk (6 of 64 tokens at 198) in its own
    # launch with a tile that fits it, instead of a full tile that is mostly masked
    chunk = args.chunk
    tail = block(seqlen % chunk)
    full = seqlen // chunk if tail < chunk else nchunks
    outputs = dict(D_ptr=args.D_ptr(), dx_ptr=dx, dB_ptr=dB, dC_ptr=dC, ddt_ptr=ddt,
                   sums_ptr=sums, dD_ptr=dD if dD is not None else sums,
                   chunk_len=chunk, **strides('g', dx))
    for first, count, tile in ((0, full, chunk), (full, nchunks - full, tail)):
        if count:
            launch(_ssd_bwd_chunk_kernel)[(nslots, batch, count)](
                **inputs, **outputs, c0=first, num_warps=num_warps, maxnreg=maxnreg,
                **dict(const, CHUNK=tile))
    # one reduction over images and chunks
    dA, dbias, *dD_slot = sums.sum(-1).unbind(0)
    if per_slot:
        dD = dD_slot[0]
    elif dD is not None:
        dD = dD.view(nslots, -1, args.headdim).sum(1)
        if dD_per_slot:
            dD = dD.sum(1)
    return dB, dC, ddt, dA, dbias, dD


def sum_heads(partials: Tensor, ndir: int, ngroups: int, out=None) -> Tensor:
    """(..., batch, seqlen, slots, dstate) -> (..., batch, seqlen, ndir, ngroups,
    dstate), accumulated in float32; written into ``out`` (any strides, e.g. a
    slice of a gradient buffer) in its dtype if given, else returned in float32.
    A leading axis (the ``dBC`` pair of :func:`scan_backward`) sums in the same
    reduction."""
    *lead, nslots, dstate = partials.shape
    heads = partials.view(*lead, ndir, ngroups, nslots // (ndir * ngroups), dstate)
    if out is None:
        return heads.sum(-2, dtype=torch.float32)
    return torch.sum(heads, -2, dtype=out.dtype, out=out)
