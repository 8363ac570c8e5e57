"""The SSD scan's forward kernel: one program per (slot, channel block, image,
segment).

Each program walks its segment of the sequence chunk by chunk (``CHUNK`` tokens),
keeping its (BLOCK_P x dstate) tile of the state in registers: nothing of size
seqlen x seqlen in memory, both directions of a bidirectional mixer in the same
launch. The equations and the layout are in ``ssd_common.py``.

A long sequence at a small batch (1024 px, batch 4) gives few programs, each
serial over a hundred chunks. It is then cut into segments of whole chunks: a
first launch computes each segment's own end state (from a zero state, the state
update alone: one of the forward's four products per chunk) and its total
log-decay; the forward's program for segment s starts from

    H_in(0) = 0,   H_in(s + 1) = exp(G(s)) H_in(s) + H_own(s)

(``G(s)``: the segment's summed log-decay, ``H_own(s)``: its state from zero), the
state the uncut scan carries into it. With one segment (training batches) there
is no first launch.
"""
import torch
import triton
import triton.language as tl

from .launch import cdiv, launch
from .ssd_common import (ScanArgs, _chunk_positions, _chunk_steps, _load_raw, _load_rows,
                         _program_bases, _slot_A, _slot_D, _tile_offsets,
                         occupancy_maxnreg, sm_count, strides)

Tensor = torch.Tensor


@triton.jit
def _state_leaving(state, xdt, gcs, glast, Bt, x, DOT_PREC: tl.constexpr):
    """The state leaving a chunk, ``exp(g_last) H + (X * exp(g_last - g))^T B``
    (``xdt`` = X in float32; the product's operands in x's dtype)."""
    return state * tl.exp(glast) + tl.dot(
        tl.trans((xdt * tl.exp(glast - gcs)[:, None]).to(x.dtype)), Bt,
        input_precision=DOT_PREC)


@triton.jit
def _ssd_fwd_kernel(
        x_ptr, B_ptr, C_ptr, dt_ptr, dt_bias_ptr, A_ptr, D_ptr, y_ptr,
        seqlen, nheads, heads_per_group, nslots,
        s_xb, s_xl, s_xd, s_xh,
        s_Bb, s_Bl, s_Bd, s_Bg,
        s_Cb, s_Cl, s_Cd, s_Cg,
        s_tb, s_tl, s_th,
        s_yb, s_yl, s_yd, s_yh,
        own_ptr, gseg_ptr, seg_chunks,
        HEADDIM: tl.constexpr, DSTATE: tl.constexpr, CHUNK: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
        HAS_D: tl.constexpr, D_PER_SLOT: tl.constexpr, A_LOG: tl.constexpr,
        DOT_PREC: tl.constexpr, P_BLOCKS: tl.constexpr):
    """One (slot, channel block, image, segment): head channels [pb * BLOCK_P,
    (pb + 1) * BLOCK_P) of the segment's ``seg_chunks`` chunks.

    The state's rows, the output's columns and X's columns are per channel, so
    the P_BLOCKS channel blocks of a head are independent programs (only
    ``C B^T`` is computed in each). Segment s > 0 starts from the state the
    earlier segments leave (``own_ptr``, ``gseg_ptr``: see the module docstring).
    """
    slot = tl.program_id(0) // P_BLOCKS
    pb = tl.program_id(0) % P_BLOCKS
    b = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    reverse, x_base, B_base, C_base, dt_base, y_base = _program_bases(
        slot, b, nheads, heads_per_group, x_ptr, B_ptr, C_ptr, dt_ptr, y_ptr, s_xb, s_xd,
        s_xh, s_Bb, s_Bd, s_Bg, s_Cb, s_Cd, s_Cg, s_tb, s_th, s_yb, s_yd, s_yh)
    offs_q, offs_p, offs_n, mask_p, mask_n, offs_state = _tile_offsets(
        pb * BLOCK_P, CHUNK, BLOCK_P, BLOCK_N, HEADDIM, DSTATE)
    causal = offs_q[:, None] >= offs_q[None, :]
    A = _slot_A(A_ptr, slot, A_LOG)
    bias = tl.load(dt_bias_ptr + slot).to(tl.float32)
    if HAS_D:
        Dv = _slot_D(D_ptr, slot, offs_p, mask_p, HEADDIM, D_PER_SLOT)
    state = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    # the state entering the segment (none before the first)
    own_rows = offs_p[:, None] * BLOCK_N + offs_n[None, :]
    nsegs = tl.num_programs(2)
    for s in range(0, seg):
        row = (b * nslots + slot) * nsegs + s
        state = state * tl.exp(tl.load(gseg_ptr + row)) + tl.load(
            own_ptr + row * (BLOCK_P * P_BLOCKS * BLOCK_N) + own_rows)
    c0 = seg * seg_chunks
    # chunk c + 1's loads are issued before chunk c's arithmetic (a chunk past the
    # end loads nothing: every token is masked)
    n_pos, n_valid, n_raw, n_x, n_B, n_C = _load_raw(
        c0 * CHUNK, seqlen, reverse, dt_base, s_tl, x_base, s_xl, B_base, s_Bl, C_base,
        s_Cl, offs_q, offs_p, offs_n, mask_p, mask_n)
    for c in range(c0, tl.minimum(c0 + seg_chunks, tl.cdiv(seqlen, CHUNK))):
        pos, valid, raw, x, Bt, Ct = n_pos, n_valid, n_raw, n_x, n_B, n_C
        n_pos, n_valid, n_raw, n_x, n_B, n_C = _load_raw(
            (c + 1) * CHUNK, seqlen, reverse, dt_base, s_tl, x_base, s_xl, B_base, s_Bl,
            C_base, s_Cl, offs_q, offs_p, offs_n, mask_p, mask_n)
        raw, dt, gcs, glast = _chunk_steps(raw, valid, bias, A, DT_SOFTPLUS)
        xdt = x.to(tl.float32) * dt[:, None]
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
        state = _state_leaving(state, xdt, gcs, glast, Bt, x, DOT_PREC)


@triton.jit
def _ssd_fwd_segment_states_kernel(
        x_ptr, B_ptr, C_ptr, dt_ptr, dt_bias_ptr, A_ptr, own_ptr, gseg_ptr,
        seqlen, nheads, heads_per_group, nslots, seg_chunks, nsegs,
        s_xb, s_xl, s_xd, s_xh,
        s_Bb, s_Bl, s_Bd, s_Bg,
        s_Cb, s_Cl, s_Cd, s_Cg,
        s_tb, s_tl, s_th,
        HEADDIM: tl.constexpr, DSTATE: tl.constexpr, CHUNK: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
        A_LOG: tl.constexpr, DOT_PREC: tl.constexpr, P_BLOCKS: tl.constexpr):
    """One (slot, channel block, image, segment s < nsegs - 1): ``H_own(s)``, the
    state segment s leaves from a zero state, into ``own`` (image, slot, segment,
    channel, state) in float32, and ``G(s)``, its summed log-decay, into ``gseg``
    (image, slot, segment)."""
    slot = tl.program_id(0) // P_BLOCKS
    pb = tl.program_id(0) % P_BLOCKS
    b = tl.program_id(1).to(tl.int64)
    seg = tl.program_id(2)
    reverse, x_base, B_base, C_base, dt_base, _ = _program_bases(
        slot, b, nheads, heads_per_group, x_ptr, B_ptr, C_ptr, dt_ptr, x_ptr, s_xb, s_xd,
        s_xh, s_Bb, s_Bd, s_Bg, s_Cb, s_Cd, s_Cg, s_tb, s_th, s_xb, s_xd, s_xh)
    offs_q, offs_p, offs_n, mask_p, mask_n, _ = _tile_offsets(
        pb * BLOCK_P, CHUNK, BLOCK_P, BLOCK_N, HEADDIM, DSTATE)
    A = _slot_A(A_ptr, slot, A_LOG)
    bias = tl.load(dt_bias_ptr + slot).to(tl.float32)
    state = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    total = 0.
    c0 = seg * seg_chunks
    n_valid, n_pos = _chunk_positions(c0 * CHUNK, seqlen, reverse, offs_q)
    n_raw = tl.load(dt_base + n_pos * s_tl, mask=n_valid, other=0.)
    n_x = _load_rows(x_base, s_xl, n_pos, n_valid, offs_p, mask_p)
    n_B = _load_rows(B_base, s_Bl, n_pos, n_valid, offs_n, mask_n)
    for c in range(c0, c0 + seg_chunks):
        valid, raw, x, Bt = n_valid, n_raw, n_x, n_B
        n_valid, n_pos = _chunk_positions((c + 1) * CHUNK, seqlen, reverse, offs_q)
        n_raw = tl.load(dt_base + n_pos * s_tl, mask=n_valid, other=0.)
        n_x = _load_rows(x_base, s_xl, n_pos, n_valid, offs_p, mask_p)
        n_B = _load_rows(B_base, s_Bl, n_pos, n_valid, offs_n, mask_n)
        raw, dt, gcs, glast = _chunk_steps(raw, valid, bias, A, DT_SOFTPLUS)
        state = _state_leaving(state, x.to(tl.float32) * dt[:, None], gcs, glast, Bt,
                               x, DOT_PREC)
        total += glast
    row = (b * nslots + slot) * nsegs + seg
    tl.store(own_ptr + row * (BLOCK_P * P_BLOCKS * BLOCK_N) + offs_p[:, None] * BLOCK_N
             + offs_n[None, :], state)
    tl.store(gseg_ptr + row, total, mask=pb == 0)


# Segments are cut while the grid stays within this many programs per
# multiprocessor, each segment at least this many chunks long. Measured in DinoVim
# at 1024 px on an H200 (benchmarks/README.md, "Kernel tuning"): at batch 1 (48
# programs for 132 multiprocessors) 8 segments halve the forward's time; at batch 4
# (192 programs) any cut is slower.
FWD_SEGMENT_PROGRAMS_PER_SM = 2
FWD_MIN_SEGMENT_CHUNKS = 8


def default_segments(args: ScanArgs, p_blocks: int = 1) -> int:
    """Segments per sequence: the most (a power of two) that keep the grid within
    :data:`FWD_SEGMENT_PROGRAMS_PER_SM` programs per multiprocessor and every
    segment at least :data:`FWD_MIN_SEGMENT_CHUNKS` chunks long; 1 for training
    batches."""
    programs = args.batch * args.nslots * p_blocks
    target = FWD_SEGMENT_PROGRAMS_PER_SM * sm_count(args.x.device)
    segments = 1
    while (programs * segments * 2 <= target
           and args.nchunks >= 2 * segments * FWD_MIN_SEGMENT_CHUNKS):
        segments *= 2
    return segments


def scan_forward(args: ScanArgs, y: Tensor, num_warps: int = 4, p_blocks: int = 1,
                 maxnreg='auto', segments: int = 0) -> Tensor:
    """Run the forward kernel, writing into ``y`` (a 5-d view like ``x``).

    Args:
        args (ScanArgs): the call.
        y (Tensor): the output, (batch, seqlen, ndir, nheads, headdim) (any strides
            but a dense last axis).
        num_warps (int): warps per program. Defaults to 4.
        p_blocks (int): programs each head's channels are split over (a power of
            two leaving at least 16 channels each). Defaults to 1: in DinoVim at
            1024 px, batch 4, four blocks measured twice as slow as one (each
            recomputes ``C B^T``; ``benchmarks/README.md``); segments are the better
            split.
        maxnreg (int | str | None): register cap per thread; None: the compiler's
            choice; 'auto': :func:`occupancy_maxnreg`.
        segments (int): pieces of whole chunks the sequence is cut into (see the
            module docstring; at most one per chunk); 0 picks
            :func:`default_segments`.

    Returns:
        Tensor: ``y``.
    """
    const = dict(args.constexprs())
    no_D = args.constexprs_without_D()
    if p_blocks & (p_blocks - 1) or const['BLOCK_P'] // p_blocks < 16:
        raise ValueError(f'scan_forward: p_blocks must be a power of two leaving at '
                         f'least 16 of the {const["BLOCK_P"]} channels, got {p_blocks}')
    segments = segments or default_segments(args, p_blocks)
    if not 1 <= segments <= args.nchunks:
        raise ValueError(f'scan_forward: segments must be between 1 and the '
                         f'{args.nchunks} chunks, got {segments}')
    seg_chunks = cdiv(args.nchunks, segments)
    segments = cdiv(args.nchunks, seg_chunks)  # none of them empty
    const.update(BLOCK_P=const['BLOCK_P'] // p_blocks, P_BLOCKS=p_blocks)
    inputs = args.inputs()
    if segments > 1:
        own = torch.empty(args.batch, args.nslots, segments, const['BLOCK_P'] * p_blocks,
                          const['BLOCK_N'], device=y.device, dtype=torch.float32)
        gseg = own.new_empty(args.batch, args.nslots, segments)
        launch(_ssd_fwd_segment_states_kernel)[
            (args.nslots * p_blocks, args.batch, segments - 1)](
                **inputs, own_ptr=own, gseg_ptr=gseg, seg_chunks=seg_chunks,
                nsegs=segments, num_warps=num_warps,
                **dict(no_D, BLOCK_P=const['BLOCK_P'], P_BLOCKS=p_blocks))
    else:
        own = gseg = args.A  # not read
    grid = (args.nslots * p_blocks, args.batch, segments)
    if maxnreg == 'auto':
        maxnreg = occupancy_maxnreg(grid[0] * grid[1] * grid[2], y.device)
    launch(_ssd_fwd_kernel)[grid](**inputs, D_ptr=args.D_ptr(), y_ptr=y,
                          **strides('y', y), own_ptr=own, gseg_ptr=gseg,
                          seg_chunks=seg_chunks, num_warps=num_warps,
                          maxnreg=maxnreg, **const)
    return y
