"""The SSD scan as one Triton program per (direction, head, image).

Each program walks its sequence chunk by chunk (``CHUNK`` tokens), keeping the
(headdim x dstate) state in registers. Per chunk, with ``X = x * dt`` and ``g``
the within-chunk cumulative ``dt * A``::

    y     = (L o C B^T) X + exp(g) (C H^T) + D x                 (L_ij = exp(g_i - g_j), i >= j)
    H_out = exp(g_last) H + (X * exp(g_last - g))^T B

which is :func:`mmdinomamba.ops.ssd_chunked` with the chunk loop inside the
kernel: one launch for the whole scan, nothing of size seqlen x seqlen in memory,
and both directions of a bidirectional mixer in the same launch. The backward
(anti-causal) direction reads its tokens last to first, so it is the same causal
scan on the flipped sequence, without copying anything.

Layout. A program's *slot* is ``direction * nheads + head``; slots of direction 1
scan backwards. Tensors are addressed through strides, so the kernels read and
write slices of bigger buffers (the mixer's packed projections) in place:

=========  ====================================================================
x, y, dx   (batch, seqlen, direction, head, headdim) via 4 strides, last axis dense
B, C       (batch, seqlen, direction, group, dstate) via 4 strides, last axis dense
dt         (batch, seqlen, head), raw (before bias and softplus), shared by directions
dt_bias    (slots,) float32; A (slots,) float32 (negative); D (slots, headdim) float32
=========  ====================================================================

The backward runs in two launches. The first, one program per (slot, image),
sweeps the chunks forwards to store the state entering each chunk, then
backwards to store the gradient of the state leaving each chunk (one matrix
product per chunk and sweep). The second, one program per (slot, image, chunk),
computes every gradient of a chunk from those two states alone, so all chunks run
in parallel and no program carries a loop's worth of live tiles (a single-launch
version that did both in one reverse loop spilled registers). Gradients of B and
C are written per slot and summed over the heads of a group by the caller.
"""
import torch
import triton
import triton.language as tl

Tensor = torch.Tensor


@triton.jit
def softplus_fp32(x):
    """``log(1 + exp(x))`` as torch's softplus (linear above 20), with an exact log1p."""
    u = tl.exp(tl.minimum(x, 20.0))
    w = 1.0 + u
    log1p = tl.where(w == 1.0, u, tl.log(w) * u / (w - 1.0))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def _chunk_positions(t0, seqlen, reverse, offs_q):
    """Token mask and sequence positions of the chunk starting at token t0 in scan
    order (a chunk outside the sequence, e.g. the one after the last, is all
    masked)."""
    t = t0 + offs_q
    valid = (t >= 0) & (t < seqlen)
    return valid, tl.where(reverse, seqlen - 1 - t, t)


@triton.jit
def _load_rows(base, stride, pos, valid, offs, mask):
    """The (chunk, width) tile of rows ``pos`` (0 where masked)."""
    return tl.load(base + pos[:, None] * stride + offs[None, :],
                   mask=valid[:, None] & mask[None, :], other=0.)


@triton.jit
def _load_raw(t0, seqlen, reverse, dt_base, s_tl, x_base, s_xl, B_base, s_Bl, C_base, s_Cl,
              offs_q, offs_p, offs_n, mask_p, mask_n):
    """The loads of the chunk starting at token t0 in scan order, nothing computed
    from them: positions,
    token mask, raw dt, x, B, C. Split from :func:`_chunk_steps` so that a loop can
    issue the next chunk's loads before it computes on the current one."""
    valid, pos = _chunk_positions(t0, seqlen, reverse, offs_q)
    raw = tl.load(dt_base + pos * s_tl, mask=valid, other=0.)
    return (pos, valid, raw, _load_rows(x_base, s_xl, pos, valid, offs_p, mask_p),
            _load_rows(B_base, s_Bl, pos, valid, offs_n, mask_n),
            _load_rows(C_base, s_Cl, pos, valid, offs_n, mask_n))


@triton.jit
def _chunk_steps(raw, valid, bias, A, DT_SOFTPLUS: tl.constexpr):
    """From the loaded raw dt: raw dt + bias (float32), dt (0 off the mask), the
    within-chunk cumulative log-decay ``g = cumsum(dt * A)`` and its last value."""
    raw = raw.to(tl.float32) + bias
    if DT_SOFTPLUS:
        dt = softplus_fp32(raw)
    else:
        dt = raw
    dt = tl.where(valid, dt, 0.)
    a = dt * A
    return raw, dt, tl.cumsum(a, 0), tl.sum(a, 0)


@triton.jit
def _load_chunk(t0, seqlen, reverse, dt_base, s_tl, bias, A, x_base, s_xl, B_base, s_Bl,
                C_base, s_Cl, offs_q, offs_p, offs_n, mask_p, mask_n,
                DT_SOFTPLUS: tl.constexpr):
    """One chunk in scan order: raw dt + bias, dt, g and g_last (see
    :func:`_chunk_steps`), x, B, C and the token mask."""
    pos, valid, raw, x, Bt, Ct = _load_raw(t0, seqlen, reverse, dt_base, s_tl, x_base,
                                           s_xl, B_base, s_Bl, C_base, s_Cl, offs_q,
                                           offs_p, offs_n, mask_p, mask_n)
    raw, dt, gcs, glast = _chunk_steps(raw, valid, bias, A, DT_SOFTPLUS)
    return pos, valid, raw, dt, gcs, glast, x, Bt, Ct


@triton.jit
def _program_bases(slot, b, nheads, heads_per_group, x_ptr, B_ptr, C_ptr, dt_ptr, y_ptr,
                   s_xb, s_xd, s_xh, s_Bb, s_Bd, s_Bg, s_Cb, s_Cd, s_Cg, s_tb, s_th,
                   s_yb, s_yd, s_yh):
    """Whether a slot scans backwards, and its base pointers into x, B, C, dt and a
    tensor laid out like y (y, dy), for image b."""
    d = slot // nheads
    h = slot % nheads
    g = h // heads_per_group
    return (d == 1, x_ptr + b * s_xb + d * s_xd + h * s_xh,
            B_ptr + b * s_Bb + d * s_Bd + g * s_Bg, C_ptr + b * s_Cb + d * s_Cd + g * s_Cg,
            dt_ptr + b * s_tb + h * s_th, y_ptr + b * s_yb + d * s_yd + h * s_yh)


@triton.jit
def _tile_offsets(p0, CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEADDIM: tl.constexpr, DSTATE: tl.constexpr):
    """Token offsets, head-channel offsets from channel p0, state offsets, the
    channel and state masks, and the flat offsets of a (BLOCK_P, BLOCK_N) state
    tile."""
    offs_q = tl.arange(0, CHUNK)
    offs_p = p0 + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    return (offs_q, offs_p, offs_n, offs_p < HEADDIM, offs_n < DSTATE,
            tl.arange(0, BLOCK_P)[:, None] * BLOCK_N + offs_n[None, :])


@triton.jit
def _ssd_fwd_kernel(
        x_ptr, B_ptr, C_ptr, dt_ptr, dt_bias_ptr, A_ptr, D_ptr, y_ptr,
        init_ptr, final_ptr, total_ptr,
        seqlen, nheads, heads_per_group, nslots, seg_chunks,
        s_xb, s_xl, s_xd, s_xh,
        s_Bb, s_Bl, s_Bd, s_Bg,
        s_Cb, s_Cl, s_Cd, s_Cg,
        s_tb, s_tl, s_th,
        s_yb, s_yl, s_yd, s_yh,
        HEADDIM: tl.constexpr, DSTATE: tl.constexpr, CHUNK: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
        HAS_D: tl.constexpr, DOT_PREC: tl.constexpr, HAS_INIT: tl.constexpr,
        STATE_ONLY: tl.constexpr, P_BLOCKS: tl.constexpr):
    """One (slot, channel block, image, segment): chunks [seg * seg_chunks,
    (seg + 1) * seg_chunks), head channels [pb * BLOCK_P, (pb + 1) * BLOCK_P).

    The state's rows, the output's columns and X's columns are per channel, so
    the P_BLOCKS channel blocks of a head are independent programs (only
    ``C B^T`` is computed in each). ``STATE_ONLY``: write the segment's final
    state (from a zero start) and its total log-decay instead of outputs.
    ``HAS_INIT``: start from the given state.
    """
    slot = tl.program_id(0) // P_BLOCKS
    pb = tl.program_id(0) % P_BLOCKS
    b = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    nseg = tl.num_programs(2)
    reverse, x_base, B_base, C_base, dt_base, y_base = _program_bases(
        slot, b, nheads, heads_per_group, x_ptr, B_ptr, C_ptr, dt_ptr, y_ptr, s_xb, s_xd,
        s_xh, s_Bb, s_Bd, s_Bg, s_Cb, s_Cd, s_Cg, s_tb, s_th, s_yb, s_yd, s_yh)
    offs_q, offs_p, offs_n, mask_p, mask_n, offs_state = _tile_offsets(
        pb * BLOCK_P, CHUNK, BLOCK_P, BLOCK_N, HEADDIM, DSTATE)
    # this program's (BLOCK_P, BLOCK_N) tile of the segment's state
    state_at = (((b * nslots + slot) * nseg + seg) * P_BLOCKS + pb) * BLOCK_P * BLOCK_N
    causal = offs_q[:, None] >= offs_q[None, :]
    A = tl.load(A_ptr + slot).to(tl.float32)
    bias = tl.load(dt_bias_ptr + slot).to(tl.float32)
    if HAS_D:
        Dv = tl.load(D_ptr + slot * HEADDIM + offs_p, mask=mask_p, other=0.)
    if HAS_INIT:
        state = tl.load(init_ptr + state_at + offs_state)
    else:
        state = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    total = 0.
    c_start = seg * seg_chunks
    c_end = tl.minimum(c_start + seg_chunks, tl.cdiv(seqlen, CHUNK))
    # chunk c + 1's loads are issued before chunk c's arithmetic (a chunk past the
    # end loads nothing: every token is masked)
    n_pos, n_valid, n_raw, n_x, n_B, n_C = _load_raw(
        c_start * CHUNK, seqlen, reverse, dt_base, s_tl, x_base, s_xl, B_base, s_Bl,
        C_base, s_Cl, offs_q, offs_p, offs_n, mask_p, mask_n)
    for c in range(c_start, c_end):
        pos, valid, raw, x, Bt, Ct = n_pos, n_valid, n_raw, n_x, n_B, n_C
        n_pos, n_valid, n_raw, n_x, n_B, n_C = _load_raw(
            (c + 1) * CHUNK, seqlen, reverse, dt_base, s_tl, x_base, s_xl, B_base, s_Bl,
            C_base, s_Cl, offs_q, offs_p, offs_n, mask_p, mask_n)
        raw, dt, gcs, glast = _chunk_steps(raw, valid, bias, A, DT_SOFTPLUS)
        xdt = x.to(tl.float32) * dt[:, None]
        if not STATE_ONLY:
            # 1. intra-chunk: (L o C B^T) X
            scores = tl.dot(Ct, tl.trans(Bt), input_precision=DOT_PREC)
            decay = tl.exp(tl.where(causal, gcs[:, None] - gcs[None, :], -float('inf')))
            y = tl.dot((scores * decay).to(x.dtype), xdt.to(x.dtype),
                       input_precision=DOT_PREC)
            # 2. state entering the chunk: exp(g) C H^T
            y += tl.exp(gcs)[:, None] * tl.dot(Ct, tl.trans(state).to(x.dtype),
                                                input_precision=DOT_PREC)
            if HAS_D:
                y += Dv[None, :] * x.to(tl.float32)
            tl.store(y_base + pos[:, None] * s_yl + offs_p[None, :],
                     y.to(y_ptr.dtype.element_ty), mask=valid[:, None] & mask_p[None, :])
        # 3. state leaving the chunk
        to_end = tl.exp(glast - gcs)
        state = state * tl.exp(glast) + tl.dot(
            tl.trans((xdt * to_end[:, None]).to(x.dtype)), Bt, input_precision=DOT_PREC)
        total += glast
    if STATE_ONLY:
        tl.store(final_ptr + state_at + offs_state, state)
        # the same value from every channel block of the head
        tl.store(total_ptr + (b * nslots + slot) * nseg + seg, total)


@triton.jit
def _segment_init_kernel(final_ptr, total_ptr, init_ptr, nseg, state_size,
                         BLOCK: tl.constexpr):
    """The state entering each segment, per (image, slot) and BLOCK state entries::

        init[0] = 0,   init[s] = exp(total[s - 1]) init[s - 1] + final[s - 1]
    """
    row = tl.program_id(0).to(tl.int64)  # image * nslots + slot
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < state_size
    state = tl.zeros((BLOCK, ), dtype=tl.float32)
    for seg in range(0, nseg):
        at = (row * nseg + seg) * state_size + offs
        tl.store(init_ptr + at, state, mask=mask)
        state = state * tl.exp(tl.load(total_ptr + row * nseg + seg)) + tl.load(
            final_ptr + at, mask=mask, other=0.)


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
        DOT_PREC: tl.constexpr):
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
    A = tl.load(A_ptr + slot).to(tl.float32)
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
        dout_ptr, carry_ptr, dx_ptr, dB_ptr, dC_ptr, ddt_ptr, dA_ptr, dbias_ptr, dD_ptr,
        seqlen, nheads, heads_per_group, nslots, nchunks, c0, chunk_len,
        s_xb, s_xl, s_xd, s_xh,
        s_Bb, s_Bl, s_Bd, s_Bg,
        s_Cb, s_Cl, s_Cd, s_Cg,
        s_tb, s_tl, s_th,
        s_yb, s_yl, s_yd, s_yh,
        s_gb, s_gl, s_gd, s_gh,
        HEADDIM: tl.constexpr, DSTATE: tl.constexpr, CHUNK: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
        HAS_D: tl.constexpr, DOT_PREC: tl.constexpr):
    """Backward pass 2, one program per (slot, image, chunk), all independent.

    From the chunk's inputs, ``dy``, and ``hin[c]``, ``dout[c]`` and ``carry[c]``
    (pass 1): dx, and per slot dB, dC, d(raw dt); per chunk the partial sums of dA,
    d(dt_bias), dD. Chunk c holds the tokens from ``c * chunk_len`` (pass 1's chunk
    length); this launch's chunks start at ``c0``, and CHUNK (the tile) may be
    shorter than chunk_len when the chunks hold fewer tokens (the sequence's tail).
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
    A = tl.load(A_ptr + slot).to(tl.float32)
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
    # g = cumsum(a): da_k = sum_{i >= k} dg_i
    da = tl.sum(tl.where(offs_q[None, :] >= offs_q[:, None], dg[None, :], 0.), 1)
    ddt = A * da + tl.sum(x.to(tl.float32) * dX, 1)
    tl.store(dA_ptr + part, tl.sum(dt * da, 0))
    dxv = dt[:, None] * dX
    if HAS_D:
        Dv = tl.load(D_ptr + slot * HEADDIM + offs_p, mask=mask_p, other=0.)
        dxv += Dv[None, :] * dy.to(tl.float32)
        tl.store(dD_ptr + part * HEADDIM + offs_p,
                 tl.sum(x.to(tl.float32) * dy.to(tl.float32), 0), mask=mask_p)
    tl.store(dx_base + pos[:, None] * s_gl + offs_p[None, :],
             dxv.to(dx_ptr.dtype.element_ty), mask=mask_qp)
    if DT_SOFTPLUS:
        ddt = ddt * tl.sigmoid(raw)
    ddt = tl.where(valid, ddt, 0.)
    tl.store(dbias_ptr + part, tl.sum(ddt, 0))
    tl.store(ddt_ptr + (b * seqlen + pos) * nslots + slot, ddt, mask=valid)


# --------------------------------------------------------------------------- #
# Launchers
# --------------------------------------------------------------------------- #
def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def dot_precision(dtype: torch.dtype) -> str:
    """Triton dot precision matching torch's matmul setting for fp32 operands."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return 'ieee'
    return 'tf32'


def default_chunk(seqlen: int) -> int:
    """Tokens per kernel chunk: 32 (measured fastest on an H200 for seqlen 198 to
    4098, both passes), 16 for sequences of at most 16 tokens."""
    return 16 if seqlen <= 16 else 32


def default_backward_chunk(seqlen: int) -> int:
    """Tokens per chunk of the backward kernels (they need not match the forward's):
    64, or the sequence rounded up to a power of two (at least 16) if shorter.
    Measured on an H200 (bf16, both directions, 24 heads of 64 x 64): 1.66 / 1.82 /
    2.25 ms with chunks 64 / 32 / 16 at batch 128 x 198 tokens, 1.04 / 1.37 / 1.95 ms
    at batch 4 x 4098 tokens."""
    return min(64, max(16, triton.next_power_of_2(seqlen)))




class ScanArgs:
    """The tensors and layout of one scan call (see the module docstring).

    Args:
        x (Tensor): viewed as (batch, seqlen, ndir, nheads, headdim).
        B, C (Tensor): viewed as (batch, seqlen, ndir, ngroups, dstate).
        dt (Tensor): (batch, seqlen, nheads) raw steps.
        dt_bias, A (Tensor): (ndir * nheads,) float32.
        D (Tensor, optional): (ndir * nheads, headdim) float32.
        dt_softplus (bool): softplus the biased step.
        chunk (int): tokens per kernel chunk (a power of two >= 16).
    """

    def __init__(self, x: Tensor, B: Tensor, C: Tensor, dt: Tensor, dt_bias: Tensor,
                 A: Tensor, D, dt_softplus: bool, chunk: int):
        for name, t in (('x', x), ('B', B), ('C', C)):
            if t.dim() != 5 or t.stride(-1) != 1:
                raise ValueError(f'ssd_triton: `{name}` must be a 5-d view with a '
                                 f'dense last axis, got shape {tuple(t.shape)}')
        self.batch, self.seqlen, self.ndir, self.nheads, self.headdim = x.shape
        self.ngroups, self.dstate = B.shape[3], B.shape[4]
        self.x, self.B, self.C, self.dt = x, B, C, dt
        self.dt_bias, self.A, self.D = dt_bias, A, D
        self.dt_softplus = dt_softplus
        self.chunk = chunk
        self.nslots = self.ndir * self.nheads
        self.nchunks = triton.cdiv(self.seqlen, chunk)

    def common(self):
        x, B, C, dt = self.x, self.B, self.C, self.dt
        return [self.seqlen, self.nheads, self.nheads // self.ngroups,
                *[x.stride(i) for i in range(4)], *[B.stride(i) for i in range(4)],
                *[C.stride(i) for i in range(4)], *[dt.stride(i) for i in range(3)]]

    def constexprs(self):
        return dict(HEADDIM=self.headdim, DSTATE=self.dstate, CHUNK=self.chunk,
                    BLOCK_P=_block(self.headdim), BLOCK_N=_block(self.dstate),
                    DT_SOFTPLUS=self.dt_softplus, HAS_D=self.D is not None,
                    DOT_PREC=dot_precision(self.x.dtype))


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count \
        if device.type == 'cuda' else 8


def default_p_blocks(args: ScanArgs) -> int:
    """Channel blocks per head of the forward scan: 2 when even two programs per
    (slot, image) leave multiprocessors idle, else 1 (each block recomputes
    ``C B^T``). Measured on an H200 (132 multiprocessors), DinoVim-B's 48 slots at
    4098 tokens: 0.147 / 0.174 ms with 2 / 1 blocks at batch 1, 0.238 / 0.233 ms
    at batch 4; at batch 128 x 198 tokens 0.41 / 0.32 ms."""
    if 2 * args.batch * args.nslots > _sm_count(args.x.device):
        return 1
    return max(1, min(2, _block(args.headdim) // 16))


# Register cap per thread of the serial-over-chunks kernels (forward scan, state
# sweeps) when they have many programs: at 168 registers a multiprocessor holds
# three programs of 4 warps instead of two, which pays for the spills once there
# are enough programs to fill the extra places. Measured on an H200, DinoVim-B,
# both directions: at 128 x 198 tokens (6144 programs) the forward 0.320 -> 0.301
# ms and the whole backward 1.464 -> 1.407 ms (with 12 heads a direction, 0.166 ->
# 0.156 and 0.785 -> 0.756); at 4 x 4098 tokens (192 programs) the cap is slower
# (forward 0.234 -> 0.298, backward 0.915 -> 0.944), and 128 registers was slower
# everywhere.
OCCUPANCY_MAXNREG = 168
OCCUPANCY_PROGRAMS_PER_SM = 8


def occupancy_maxnreg(programs: int, device: torch.device):
    """:data:`OCCUPANCY_MAXNREG` when there are more than
    :data:`OCCUPANCY_PROGRAMS_PER_SM` programs per multiprocessor, else None (no
    cap)."""
    if programs > OCCUPANCY_PROGRAMS_PER_SM * _sm_count(device):
        return OCCUPANCY_MAXNREG
    return None


def scan_forward(args: ScanArgs, y: Tensor, num_warps: int = 4, segments: int = 1,
                 p_blocks: int = 0, maxnreg='auto') -> Tensor:
    """Run the forward kernel, writing into ``y`` (a 5-d view like ``x``).

    With ``segments > 1`` each sequence is cut into that many segments scanned in
    parallel: a first pass computes every segment's final state from zero, a
    short recurrence over segments gives each segment's initial state, and a
    second pass computes the outputs (measured slower than one segment in every
    case tried on an H200, down to batch 1 x 4098 tokens, so not the default).
    ``p_blocks`` splits each head's channels over that many programs (a power of
    two, leaving at least 16 channels each); 0 picks :func:`default_p_blocks`.
    ``maxnreg`` caps the registers per thread (None: the compiler's choice;
    'auto': :func:`occupancy_maxnreg`).
    """
    const = args.constexprs()
    p_blocks = p_blocks or default_p_blocks(args)
    if p_blocks & (p_blocks - 1) or const['BLOCK_P'] // p_blocks < 16:
        raise ValueError(f'scan_forward: p_blocks must be a power of two leaving at '
                         f'least 16 of the {const["BLOCK_P"]} channels, got {p_blocks}')
    const.update(BLOCK_P=const['BLOCK_P'] // p_blocks, P_BLOCKS=p_blocks)
    seg_chunks = triton.cdiv(args.nchunks, segments)
    segments = triton.cdiv(args.nchunks, seg_chunks)
    grid = (args.nslots * p_blocks, args.batch, segments)
    if maxnreg == 'auto':
        maxnreg = occupancy_maxnreg(grid[0] * grid[1] * grid[2], y.device)
    D = args.D if args.D is not None else args.A
    common = (args.seqlen, args.nheads, args.nheads // args.ngroups, args.nslots,
              seg_chunks, *args.common()[3:], *[y.stride(i) for i in range(4)])
    init = final = total = args.A  # unused pointers when segments == 1
    if segments > 1:
        kw = dict(device=y.device, dtype=torch.float32)
        final = torch.empty(args.batch, args.nslots, segments, _block(args.headdim),
                            const['BLOCK_N'], **kw)
        total = torch.empty(args.batch, args.nslots, segments, **kw)
        _ssd_fwd_kernel[grid](
            args.x, args.B, args.C, args.dt, args.dt_bias, args.A, D, y, init, final,
            total, *common, num_warps=num_warps, maxnreg=maxnreg, HAS_INIT=False,
            STATE_ONLY=True, **const)
        init = torch.empty_like(final)
        state = final[0, 0, 0].numel()
        _segment_init_kernel[(args.batch * args.nslots, triton.cdiv(state, 1024))](
            final, total, init, segments, state, BLOCK=1024)
    _ssd_fwd_kernel[grid](
        args.x, args.B, args.C, args.dt, args.dt_bias, args.A, D, y, init, final, total,
        *common, num_warps=num_warps, maxnreg=maxnreg, HAS_INIT=segments > 1,
        STATE_ONLY=False, **const)
    return y


def scan_backward(args: ScanArgs, dy: Tensor, dx: Tensor, num_warps: int = 4,
                  states_warps: int = 4, maxnreg=None, states_maxnreg='auto',
                  dD_per_slot: bool = False):
    """Run the backward kernels: the two state sweeps, then every chunk in parallel.

    Args:
        args (ScanArgs): the forward call.
        dy (Tensor): gradient of y, a 5-d view like ``x``.
        dx (Tensor): written with the gradient of x (5-d view like ``x``).
        num_warps (int): warps per program of the per-chunk kernel.
        states_warps (int): warps per program of the state sweeps.
        maxnreg, states_maxnreg (int, optional): register caps per thread of the
            per-chunk kernel and the state sweeps (None: the compiler's choice;
            'auto': :func:`occupancy_maxnreg`). Caps of 128 to 192 made the
            per-chunk kernel 14-34% slower on an H200, so it has none by default.
        dD_per_slot (bool): return dD summed over the head's channels too,
            (slots,), for a D shared by the channels of a head (one reduction over
            a contiguous axis instead of two).

    Returns:
        tuple: ``dB``, ``dC`` (batch, seqlen, slots, dstate) in x's dtype, per
        slot, to be summed over the heads of each group by :func:`sum_heads`;
        float32 ``ddt`` (batch, seqlen, slots) of the raw step, ``dA`` and
        ``ddt_bias`` (slots,) and ``dD`` (slots, headdim), or (slots,) with
        ``dD_per_slot``, or None, summed over the batch.
    """
    kw = dict(device=args.x.device, dtype=torch.float32)
    batch, seqlen, nslots, nchunks = args.batch, args.seqlen, args.nslots, args.nchunks
    const = args.constexprs()
    # states entering (hin) and gradients leaving (dout) each chunk, in x's dtype
    hin = torch.empty(batch, nslots, nchunks, const['BLOCK_P'], const['BLOCK_N'],
                      device=args.x.device, dtype=args.x.dtype)
    dout = torch.empty_like(hin)
    carry = torch.empty(batch, nslots, nchunks, **kw)
    # per-slot partials in x's dtype: summed over heads (in fp32) into a gradient
    # of that dtype anyway, and half the bytes of fp32 for bf16 inputs
    dB = torch.empty(batch, seqlen, nslots, args.dstate, device=args.x.device,
                     dtype=args.x.dtype)
    dC = torch.empty_like(dB)
    ddt = torch.empty(batch, seqlen, nslots, **kw)
    dA = torch.empty(nslots, batch * nchunks, **kw)
    dbias = torch.empty_like(dA)
    dD = torch.empty(nslots, batch * nchunks, args.headdim, **kw) \
        if args.D is not None else None
    D = args.D if args.D is not None else args.A
    common = (seqlen, args.nheads, args.nheads // args.ngroups, nslots, nchunks,
              *args.common()[3:], *[dy.stride(i) for i in range(4)])
    const_states = {k: v for k, v in const.items() if k != 'HAS_D'}
    if states_maxnreg == 'auto':
        states_maxnreg = occupancy_maxnreg(nslots * batch, dy.device)
    _ssd_bwd_states_kernel[(nslots, batch)](
        args.x, args.B, args.C, args.dt, args.dt_bias, args.A, dy, hin, dout, carry,
        *common, num_warps=states_warps, maxnreg=states_maxnreg, **const_states)
    # every chunk in parallel; a short last chunk (6 of 64 tokens at 198) in its own
    # launch with a tile that fits it, instead of a full tile that is mostly masked
    chunk = args.chunk
    tail = _block(seqlen % chunk)
    full = seqlen // chunk if tail < chunk else nchunks
    chunk_args = (args.x, args.B, args.C, args.dt, args.dt_bias, args.A, D, dy, hin,
                  dout, carry, dx, dB, dC, ddt, dA, dbias, dD if dD is not None else dA)
    strides = (*common[5:], *[dx.stride(i) for i in range(4)])
    for first, count, tile in ((0, full, chunk), (full, nchunks - full, tail)):
        if count:
            _ssd_bwd_chunk_kernel[(nslots, batch, count)](
                *chunk_args, *common[:5], first, chunk, *strides, num_warps=num_warps,
                maxnreg=maxnreg, **dict(const, CHUNK=tile))
    # one reduction each over images and chunks
    if dD is not None:
        dD = dD.view(nslots, -1).sum(1) if dD_per_slot else dD.sum(1)
    return dB, dC, ddt, dA.sum(1), dbias.sum(1), dD


def sum_heads(partials: Tensor, ndir: int, ngroups: int, out=None) -> Tensor:
    """(batch, seqlen, slots, dstate) -> (batch, seqlen, ndir, ngroups, dstate),
    accumulated in float32; written into ``out`` (any strides, e.g. a slice of a
    gradient buffer) in its dtype if given, else returned in float32."""
    batch, seqlen, nslots, dstate = partials.shape
    heads = partials.view(batch, seqlen, ndir, ngroups, nslots // (ndir * ngroups),
                          dstate)
    if out is None:
        return heads.sum(4, dtype=torch.float32)
    return torch.sum(heads, 4, dtype=out.dtype, out=out)


# --------------------------------------------------------------------------- #
# The op-level backend: same signature as mmdinomamba.ops.ssd (one direction)
# --------------------------------------------------------------------------- #
class _SSDScan(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, dt_bias, dt_softplus, chunk):
        batch, seqlen, nheads, headdim = x.shape
        ngroups = B.shape[2]
        x5 = x.contiguous().view(batch, seqlen, 1, nheads, headdim)
        B5 = B.to(x.dtype).contiguous().view(batch, seqlen, 1, ngroups, -1)
        C5 = C.to(x.dtype).contiguous().view(batch, seqlen, 1, ngroups, -1)
        A32 = A.float().contiguous()
        bias32 = (dt_bias.float().contiguous() if dt_bias is not None else
                  torch.zeros(nheads, device=x.device))
        D32 = None
        if D is not None:
            D32 = (D.float() if D.dim() == 2 else D.float()[:, None].expand(
                nheads, headdim)).contiguous()
        args = ScanArgs(x5, B5, C5, dt, bias32, A32, D32, dt_softplus,
                        chunk or default_chunk(seqlen))
        y = torch.empty_like(x5)
        scan_forward(args, y)
        ctx.save_for_backward(x5, B5, C5, dt, bias32, A32, D32)
        ctx.meta = (dt_softplus, chunk, D is not None and D.dim() == 1,
                    B.dtype, dt_bias is not None, A.dtype, D.dtype if D is not None
                    else None, dt.dtype)
        return y.view(batch, seqlen, nheads, headdim)

    @staticmethod
    def backward(ctx, dy):
        x5, B5, C5, dt, bias32, A32, D32 = ctx.saved_tensors
        (dt_softplus, chunk, D_per_head, B_dtype, has_bias, A_dtype, D_dtype,
         dt_dtype) = ctx.meta
        args = ScanArgs(x5, B5, C5, dt, bias32, A32, D32, dt_softplus,
                        chunk or default_backward_chunk(x5.shape[1]))
        dy5 = dy.contiguous().view(x5.shape)
        dx = torch.empty_like(x5)
        dB, dC, ddt, dA, dbias, dD = scan_backward(args, dy5, dx, dD_per_slot=D_per_head)
        ngroups = B5.shape[3]
        dB = sum_heads(dB, 1, ngroups)[:, :, 0].to(B_dtype)
        dC = sum_heads(dC, 1, ngroups)[:, :, 0].to(B_dtype)
        dD_out = dD.to(D_dtype) if dD is not None else None
        return (dx.view(dy.shape), ddt.to(dt_dtype), dA.to(A_dtype), dB, dC,
                dD_out, dbias if has_bias else None, None, None)


def ssd_triton(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
               D=None, z=None, dt_bias=None, dt_softplus: bool = False,
               chunk: int = 0) -> Tensor:
    """Causal SSD scan with the Triton kernels (autograd supported).

    Args:
        x (Tensor): (batch, seqlen, nheads, headdim), float16/bfloat16/float32, CUDA.
        dt (Tensor): (batch, seqlen, nheads).
        A (Tensor): (nheads,).
        B, C (Tensor): (batch, seqlen, ngroups, dstate).
        D (Tensor, optional): (nheads,) or (nheads, headdim).
        z (Tensor, optional): (batch, seqlen, nheads, headdim); output * silu(z).
        dt_bias (Tensor, optional): (nheads,).
        dt_softplus (bool): ``dt = softplus(dt + dt_bias)``.
        chunk (int): tokens per kernel chunk; 0 picks :func:`default_chunk` for the
            forward and :func:`default_backward_chunk` for the backward.

    Returns:
        Tensor: (batch, seqlen, nheads, headdim) in x's dtype.
    """
    y = _SSDScan.apply(x, dt, A, B, C, D, dt_bias, dt_softplus, chunk)
    if z is not None:
        y = (y.float() * torch.nn.functional.silu(z.float())).to(x.dtype)
    return y
