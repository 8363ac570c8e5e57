"""The SSD scan's forward kernel: one program per (slot, channel block, image).

Each program walks its sequence chunk by chunk (``CHUNK`` tokens), keeping its
(BLOCK_P x dstate) tile of the state in registers: one launch for the whole scan,
nothing of size seqlen x seqlen in memory, both directions of a bidirectional
mixer in the same launch. The equations and the layout are in ``ssd_common.py``.
"""
import torch
import triton
import triton.language as tl

from .launch import launch
from .ssd_common import (ScanArgs, _chunk_steps, _load_raw, _program_bases, _tile_offsets,
                         block, occupancy_maxnreg, sm_count, strides)

Tensor = torch.Tensor


@triton.jit
def _ssd_fwd_kernel(
        x_ptr, B_ptr, C_ptr, dt_ptr, dt_bias_ptr, A_ptr, D_ptr, y_ptr,
        seqlen, nheads, heads_per_group, nslots,
        s_xb, s_xl, s_xd, s_xh,
        s_Bb, s_Bl, s_Bd, s_Bg,
        s_Cb, s_Cl, s_Cd, s_Cg,
        s_tb, s_tl, s_th,
        s_yb, s_yl, s_yd, s_yh,
        HEADDIM: tl.constexpr, DSTATE: tl.constexpr, CHUNK: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
        HAS_D: tl.constexpr, DOT_PREC: tl.constexpr, P_BLOCKS: tl.constexpr):
    """One (slot, channel block, image): head channels [pb * BLOCK_P, (pb + 1) *
    BLOCK_P) of every chunk.

    The state's rows, the output's columns and X's columns are per channel, so
    the P_BLOCKS channel blocks of a head are independent programs (only
    ``C B^T`` is computed in each).
    """
    slot = tl.program_id(0) // P_BLOCKS
    pb = tl.program_id(0) % P_BLOCKS
    b = tl.program_id(1).to(tl.int64)
    reverse, x_base, B_base, C_base, dt_base, y_base = _program_bases(
        slot, b, nheads, heads_per_group, x_ptr, B_ptr, C_ptr, dt_ptr, y_ptr, s_xb, s_xd,
        s_xh, s_Bb, s_Bd, s_Bg, s_Cb, s_Cd, s_Cg, s_tb, s_th, s_yb, s_yd, s_yh)
    offs_q, offs_p, offs_n, mask_p, mask_n, offs_state = _tile_offsets(
        pb * BLOCK_P, CHUNK, BLOCK_P, BLOCK_N, HEADDIM, DSTATE)
    causal = offs_q[:, None] >= offs_q[None, :]
    A = tl.load(A_ptr + slot).to(tl.float32)
    bias = tl.load(dt_bias_ptr + slot).to(tl.float32)
    if HAS_D:
        Dv = tl.load(D_ptr + slot * HEADDIM + offs_p, mask=mask_p, other=0.)
    state = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    # chunk c + 1's loads are issued before chunk c's arithmetic (a chunk past the
    # end loads nothing: every token is masked)
    n_pos, n_valid, n_raw, n_x, n_B, n_C = _load_raw(
        0, seqlen, reverse, dt_base, s_tl, x_base, s_xl, B_base, s_Bl, C_base, s_Cl,
        offs_q, offs_p, offs_n, mask_p, mask_n)
    for c in range(0, tl.cdiv(seqlen, CHUNK)):
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
        to_end = tl.exp(glast - gcs)
        state = state * tl.exp(glast) + tl.dot(
            tl.trans((xdt * to_end[:, None]).to(x.dtype)), Bt, input_precision=DOT_PREC)


# Programs per multiprocessor the forward's grid is split up to (by channel blocks):
# each program walks its whole sequence serially, so a grid of a few programs per
# multiprocessor (long sequences at small batches: 1024 px, batch 4) leaves each one
# waiting on its memory latency
FWD_PROGRAMS_PER_SM = 4


def default_p_blocks(args: ScanArgs) -> int:
    """Channel blocks per head: the fewest (a power of two leaving at least 16
    channels each) that give :data:`FWD_PROGRAMS_PER_SM` programs per
    multiprocessor, or as many as the head allows (each block recomputes
    ``C B^T``)."""
    programs, most = args.batch * args.nslots, max(1, block(args.headdim) // 16)
    target = FWD_PROGRAMS_PER_SM * sm_count(args.x.device)
    p_blocks = 1
    while p_blocks < most and programs * p_blocks < target:
        p_blocks *= 2
    return p_blocks


def scan_forward(args: ScanArgs, y: Tensor, num_warps: int = 4, p_blocks: int = 0,
                 maxnreg='auto') -> Tensor:
    """Run the forward kernel, writing into ``y`` (a 5-d view like ``x``).

    Args:
        args (ScanArgs): the call.
        y (Tensor): the output, (batch, seqlen, ndir, nheads, headdim) (any strides
            but a dense last axis).
        num_warps (int): warps per program. Defaults to 4.
        p_blocks (int): programs each head's channels are split over (a power of
            two leaving at least 16 channels each); 0 picks :func:`default_p_blocks`.
        maxnreg (int | str | None): register cap per thread; None: the compiler's
            choice; 'auto': :func:`occupancy_maxnreg`.

    Returns:
        Tensor: ``y``.
    """
    const = dict(args.constexprs())
    p_blocks = p_blocks or default_p_blocks(args)
    if p_blocks & (p_blocks - 1) or const['BLOCK_P'] // p_blocks < 16:
        raise ValueError(f'scan_forward: p_blocks must be a power of two leaving at '
                         f'least 16 of the {const["BLOCK_P"]} channels, got {p_blocks}')
    const.update(BLOCK_P=const['BLOCK_P'] // p_blocks, P_BLOCKS=p_blocks)
    grid = (args.nslots * p_blocks, args.batch)
    if maxnreg == 'auto':
        maxnreg = occupancy_maxnreg(grid[0] * grid[1], y.device)
    launch(_ssd_fwd_kernel)[grid](**args.inputs(), D_ptr=args.D_ptr(), y_ptr=y,
                          **strides('y', y), num_warps=num_warps,
                          maxnreg=maxnreg, **const)
    return y
