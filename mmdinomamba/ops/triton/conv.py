"""Depthwise causal conv1d + SiLU for both scan directions in one pass (Triton).

For direction 0 (causal) and direction 1 (anti-causal, the flipped-sequence conv
read in sequence order), with kernel size K and weights ``w_d``::

    out_0[t] = silu(b_0 + sum_k w_0[k] x[t - (K - 1) + k])
    out_1[t] = silu(b_1 + sum_k w_1[k] x[t + (K - 1) - k])

Direction 1 equals flipping the sequence, running the usual causal conv and
flipping back, without the copies. Row strides are passed divided by
``ROW_ALIGN`` so that Triton knows rows start on 16-byte boundaries and loads
whole vectors (the packed projection's row length, 3224 for DinoVim-B, is not a
multiple of 16 elements, which Triton would otherwise assume nothing about).
"""
import math

import torch
import triton
import triton.language as tl

from .launch import cdiv, launch

Tensor = torch.Tensor

# Tokens walked by one program (forward, backward) and channels it owns (two per
# thread). Both kernels take their steps in groups of four whose rows are loaded
# together (a program that waits on one row at a time is bound by the latency of
# its loads). The sizes were chosen by measurement: benchmarks/README.md, "Kernel
# tuning".
FWD_BLOCK_T = 32
BWD_BLOCK_T = 128
BLOCK_C = 128
NUM_WARPS = 2


# Sliding-window kernels: each program owns a block of channels and walks its
# tokens, keeping the rows the four taps need in registers, so every input row is
# read once and no reduction crosses threads. The window is
# written out for the kernel size 4 of Mamba-2 (the wrappers check it).
@triton.jit
def _row(ptr, t, seqlen, s_l, offs_c, mask_c):
    """Row t of a (tokens, channels) slice as float32, zeros outside [0, seqlen)."""
    inside = (t >= 0) & (t < seqlen)
    return tl.load(ptr + t * s_l + offs_c, mask=mask_c & inside, other=0.).to(tl.float32)


@triton.jit
def _rows4(ptr, t, seqlen, s_l, offs_c, mask_c):
    """Rows t .. t + 3 (see :func:`_row`), their loads issued together."""
    return (_row(ptr, t, seqlen, s_l, offs_c, mask_c),
            _row(ptr, t + 1, seqlen, s_l, offs_c, mask_c),
            _row(ptr, t + 2, seqlen, s_l, offs_c, mask_c),
            _row(ptr, t + 3, seqlen, s_l, offs_c, mask_c))


@triton.jit
def _taps(w_ptr, b_ptr, d, dim, offs_c, mask, HAS_BIAS: tl.constexpr,
          BLOCK_C: tl.constexpr):
    """Direction d's weights w_d[0..3] and bias b_d (zeros without bias) for the
    channels offs_c, float32 (weights (ndir, dim, 4), bias (ndir, dim))."""
    w = w_ptr + (d * dim + offs_c) * 4
    if HAS_BIAS:
        bias = tl.load(b_ptr + d * dim + offs_c, mask=mask, other=0.)
    else:
        bias = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    return (tl.load(w + 0, mask=mask, other=0.), tl.load(w + 1, mask=mask, other=0.),
            tl.load(w + 2, mask=mask, other=0.), tl.load(w + 3, mask=mask, other=0.),
            bias)


@triton.jit
def _pick(u: tl.constexpr, r0, r1, r2, r3):
    """Row u of a group of four (u is a compile-time constant)."""
    if u == 0:
        r = r0
    elif u == 1:
        r = r1
    elif u == 2:
        r = r2
    else:
        r = r3
    return r


@triton.jit
def _conv_fwd_kernel(x_ptr, w_ptr, b_ptr, out_ptr, seqlen, dim,
                     s_xb, s_xl, s_ob, s_ol, s_od,
                     NDIR: tl.constexpr, HAS_BIAS: tl.constexpr, ROW_ALIGN: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """Steps go in groups of four whose input rows are loaded before the first of
    them is used, so that four loads are in flight instead of one."""
    s_xl = s_xl * ROW_ALIGN
    s_ol = s_ol * ROW_ALIGN
    s_od = s_od * ROW_ALIGN
    b = tl.program_id(1).to(tl.int64)
    t0 = tl.program_id(2) * BLOCK_T
    t_end = tl.minimum(t0 + BLOCK_T, seqlen)
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < dim
    x_base = x_ptr + b * s_xb
    out_base = out_ptr + b * s_ob + offs_c
    # taps: direction 0 reads x[t-3..t] with w0[0..3], direction 1 x[t+3..t] with w1[0..3]
    a0, a1, a2, a3, bias0 = _taps(w_ptr, b_ptr, 0, dim, offs_c, mask_c, HAS_BIAS,
                                  BLOCK_C)
    c0, c1, c2, c3, bias1 = _taps(w_ptr, b_ptr, 1, dim, offs_c, mask_c & (NDIR == 2),
                                  HAS_BIAS, BLOCK_C)
    # window x[t-3 .. t+3]
    xm3 = _row(x_base, t0 - 3, seqlen, s_xl, offs_c, mask_c)
    xm2 = _row(x_base, t0 - 2, seqlen, s_xl, offs_c, mask_c)
    xm1 = _row(x_base, t0 - 1, seqlen, s_xl, offs_c, mask_c)
    x0 = _row(x_base, t0, seqlen, s_xl, offs_c, mask_c)
    xp1 = _row(x_base, t0 + 1, seqlen, s_xl, offs_c, mask_c)
    xp2 = _row(x_base, t0 + 2, seqlen, s_xl, offs_c, mask_c)
    for tg in range(t0, t_end, 4):
        r0, r1, r2, r3 = _rows4(x_base, tg + 3, seqlen, s_xl, offs_c, mask_c)
        for u in tl.static_range(4):
            t = tg + u
            mask = mask_c & (t < t_end)
            xp3 = _pick(u, r0, r1, r2, r3)
            pre = bias0 + a0 * xm3 + a1 * xm2 + a2 * xm1 + a3 * x0
            tl.store(out_base + t * s_ol,
                     (pre * tl.sigmoid(pre)).to(out_ptr.dtype.element_ty), mask=mask)
            if NDIR == 2:
                pre = bias1 + c0 * xp3 + c1 * xp2 + c2 * xp1 + c3 * x0
                tl.store(out_base + t * s_ol + s_od,
                         (pre * tl.sigmoid(pre)).to(out_ptr.dtype.element_ty), mask=mask)
            xm3, xm2, xm1, x0, xp1, xp2 = xm2, xm1, x0, xp1, xp2, xp3


@triton.jit
def _dsilu(pre, dout):
    sig = tl.sigmoid(pre)
    return dout * sig * (1. + pre * (1. - sig))


@triton.jit
def _tap_grads(bias, w0, w1, w2, w3, r0, r1, r2, r3, dout, owned, dw0, dw1, dw2, dw3, db):
    """One direction at one token whose taps w0..w3 read rows r0..r3: the gradient
    before SiLU, g, and dw_k + owned * g * r_k, db + owned * g."""
    g = _dsilu(bias + w0 * r0 + w1 * r1 + w2 * r2 + w3 * r3, dout)
    return (g, dw0 + owned * g * r0, dw1 + owned * g * r1, dw2 + owned * g * r2,
            dw3 + owned * g * r3, db + owned * g)


@triton.jit
def _conv_bwd_kernel(x_ptr, w_ptr, b_ptr, dout_ptr, dx_ptr, part_ptr, seqlen, dim,
                     s_xb, s_xl, s_ob, s_ol, s_od, s_gb, s_gl,
                     NDIR: tl.constexpr, HAS_BIAS: tl.constexpr, ROW_ALIGN: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """dx, and the partial dw / db of this program's tokens: row ``image * splits +
    split`` of ``part`` (rows, ndir * dim * 5) holds dw (ndir, dim, 4), then db
    (ndir, dim) (computed even without a bias), so that one reduction gives both,
    each in its parameter's layout.

    Step t computes the gradient before SiLU at t + 3 (from x[t .. t+6]) and dx[t]
    from the gradients before SiLU at t .. t+3 (direction 0) and t-3 .. t
    (direction 1): dx[t] = sum_m w0[3-m] g0[t+m] + w1[3-m] g1[t-m].
    """
    s_xl = s_xl * ROW_ALIGN
    s_ol = s_ol * ROW_ALIGN
    s_od = s_od * ROW_ALIGN
    s_gl = s_gl * ROW_ALIGN
    b = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    t0 = split * BLOCK_T
    t_end = tl.minimum(t0 + BLOCK_T, seqlen)
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < dim
    x_base = x_ptr + b * s_xb
    do_base = dout_ptr + b * s_ob
    a0, a1, a2, a3, bias0 = _taps(w_ptr, b_ptr, 0, dim, offs_c, mask_c, HAS_BIAS,
                                  BLOCK_C)
    c0, c1, c2, c3, bias1 = _taps(w_ptr, b_ptr, 1, dim, offs_c, mask_c & (NDIR == 2),
                                  HAS_BIAS, BLOCK_C)
    # window x[t .. t+6] for the first step t = t0 - 6
    first = t0 - 6
    x0 = _row(x_base, first, seqlen, s_xl, offs_c, mask_c)
    x1 = _row(x_base, first + 1, seqlen, s_xl, offs_c, mask_c)
    x2 = _row(x_base, first + 2, seqlen, s_xl, offs_c, mask_c)
    x3 = _row(x_base, first + 3, seqlen, s_xl, offs_c, mask_c)
    x4 = _row(x_base, first + 4, seqlen, s_xl, offs_c, mask_c)
    x5 = _row(x_base, first + 5, seqlen, s_xl, offs_c, mask_c)
    # Gradients before SiLU: g0 at t .. t+2, g1 at t-3 .. t+2 (filled as we go).
    # Each starts as its own zeros: Triton carries a variable through the loop
    # only if the loop changes its value, and a window shift of equal start
    # values (g0_0 = g0_1 with both the same zeros) would look unchanged.
    g0_0 = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    g0_1 = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    g0_2 = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    g1_m3 = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    g1_m2 = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    g1_m1 = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    g1_0 = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    g1_1 = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    g1_2 = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    zero = tl.zeros((BLOCK_C, ), dtype=tl.float32)
    dw00, dw01, dw02, dw03 = zero, zero, zero, zero
    dw10, dw11, dw12, dw13 = zero, zero, zero, zero
    db0, db1 = zero, zero
    for tg in range(first, t_end, 4):
        # the group's new rows: x[t + 6] and the output gradients at t + 3
        r0, r1, r2, r3 = _rows4(x_base, tg + 6, seqlen, s_xl, offs_c, mask_c)
        p0, p1, p2, p3 = _rows4(do_base, tg + 3, seqlen, s_ol, offs_c, mask_c)
        if NDIR == 2:
            q0, q1, q2, q3 = _rows4(do_base + s_od, tg + 3, seqlen, s_ol, offs_c, mask_c)
        else:
            q0, q1, q2, q3 = p0, p1, p2, p3
        for u in tl.static_range(4):
            t = tg + u
            x6 = _pick(u, r0, r1, r2, r3)
            tn = t + 3  # the token whose pre-SiLU gradient enters the window
            owned = ((tn >= t0) & (tn < t_end)).to(tl.float32)  # count it once for dw
            g0_3, dw00, dw01, dw02, dw03, db0 = _tap_grads(
                bias0, a0, a1, a2, a3, x0, x1, x2, x3, _pick(u, p0, p1, p2, p3), owned,
                dw00, dw01, dw02, dw03, db0)
            dx = a3 * g0_0 + a2 * g0_1 + a1 * g0_2 + a0 * g0_3
            if NDIR == 2:
                g1_3, dw10, dw11, dw12, dw13, db1 = _tap_grads(
                    bias1, c0, c1, c2, c3, x6, x5, x4, x3, _pick(u, q0, q1, q2, q3), owned,
                    dw10, dw11, dw12, dw13, db1)
                dx += c3 * g1_0 + c2 * g1_m1 + c1 * g1_m2 + c0 * g1_m3
                g1_m3, g1_m2, g1_m1, g1_0, g1_1, g1_2 = g1_m2, g1_m1, g1_0, g1_1, g1_2, g1_3
            tl.store(dx_ptr + b * s_gb + t * s_gl + offs_c, dx.to(dx_ptr.dtype.element_ty),
                     mask=mask_c & (t >= t0) & (t < t_end))
            g0_0, g0_1, g0_2 = g0_1, g0_2, g0_3
            x0, x1, x2, x3, x4, x5 = x1, x2, x3, x4, x5, x6
    # this program's row of `part`: [dw of direction 0 (dim, 4), of direction 1,
    # db of direction 0 (dim), of direction 1], the parameters' own layouts
    row = (b * tl.num_programs(2) + split) * (NDIR * dim * 5)
    taps = part_ptr + row + offs_c * 4
    tl.store(taps + 0, dw00, mask=mask_c)
    tl.store(taps + 1, dw01, mask=mask_c)
    tl.store(taps + 2, dw02, mask=mask_c)
    tl.store(taps + 3, dw03, mask=mask_c)
    biases = part_ptr + row + NDIR * dim * 4 + offs_c
    tl.store(biases, db0, mask=mask_c)
    if NDIR == 2:
        taps += dim * 4
        tl.store(taps + 0, dw10, mask=mask_c)
        tl.store(taps + 1, dw11, mask=mask_c)
        tl.store(taps + 2, dw12, mask=mask_c)
        tl.store(taps + 3, dw13, mask=mask_c)
        tl.store(biases + dim, db1, mask=mask_c)


def row_align(element_size: int, *strides: int) -> int:
    """Largest power of two (at most 16 bytes of elements) dividing every stride."""
    common = 16 // element_size
    for s in strides:  # the largest power of two dividing all: of their gcd too
        common = math.gcd(common, s)
    return common


def _grid(batch, seqlen, dim, block_t):
    return (cdiv(dim, BLOCK_C), batch, cdiv(seqlen, block_t))


def _layout(x: Tensor, *others: Tensor):
    """ROW_ALIGN and the row strides divided by it."""
    strides = [x.stride(1)] + [s for t in others for s in t.stride()[1:-1]]
    align = row_align(x.element_size(), *strides)
    return align


def _check_kernel(weight: Tensor):
    if weight.dim() != 3 or weight.shape[-1] != 4 or weight.shape[0] not in (1, 2):
        raise ValueError(f'conv: the Triton conv needs weights (ndir in 1, 2, dim, 4), '
                         f'got {tuple(weight.shape)}')


def _check_dense(**tensors: Tensor):
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f'conv: `{name}` must have a dense last axis, got strides '
                             f'{t.stride()}')


def conv_forward(x: Tensor, weight: Tensor, bias, out: Tensor) -> Tensor:
    """Both directions' conv + SiLU.

    Args:
        x (Tensor): (batch, seqlen, dim), last axis dense (a slice is fine).
        weight (Tensor): (ndir, dim, 4) float32, contiguous.
        bias (Tensor, optional): (ndir, dim) float32, contiguous.
        out (Tensor): (batch, seqlen, ndir, dim), last axis dense; written.

    Returns:
        Tensor: ``out``.
    """
    _check_kernel(weight)
    _check_dense(x=x, out=out)
    batch, seqlen, dim = x.shape
    a = _layout(x, out)
    launch(_conv_fwd_kernel)[_grid(batch, seqlen, dim, FWD_BLOCK_T)](
        x, weight, bias if bias is not None else weight, out, seqlen, dim,
        x.stride(0), x.stride(1) // a, out.stride(0), out.stride(1) // a,
        out.stride(2) // a, NDIR=weight.shape[0], HAS_BIAS=bias is not None,
        ROW_ALIGN=a, BLOCK_T=FWD_BLOCK_T, BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)
    return out


def conv_backward(x: Tensor, weight: Tensor, bias, dout: Tensor, dx: Tensor):
    """Gradients of :func:`conv_forward` in one pass.

    Args:
        x, weight, bias: as in :func:`conv_forward`.
        dout (Tensor): (batch, seqlen, ndir, dim), gradient of the output.
        dx (Tensor): (batch, seqlen, dim), written with the gradient of x.

    Returns:
        tuple: ``dweight`` (ndir, dim, 4) and ``dbias`` (ndir, dim) or None, float32.
    """
    _check_kernel(weight)
    _check_dense(x=x, dx=dx)
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    batch, seqlen, dim = x.shape
    ndir = weight.shape[0]
    grid = _grid(batch, seqlen, dim, BWD_BLOCK_T)
    rows = batch * grid[2]
    part = torch.empty(rows, ndir * dim * 5, device=x.device, dtype=torch.float32)
    a = math.gcd(_layout(x, dout), row_align(dx.element_size(), dx.stride(1)))
    launch(_conv_bwd_kernel)[grid](
        x, weight, bias if bias is not None else weight, dout, dx, part, seqlen, dim,
        x.stride(0), x.stride(1) // a, dout.stride(0), dout.stride(1) // a,
        dout.stride(2) // a, dx.stride(0), dx.stride(1) // a, NDIR=ndir,
        HAS_BIAS=bias is not None, ROW_ALIGN=a, BLOCK_T=BWD_BLOCK_T, BLOCK_C=BLOCK_C,
        num_warps=NUM_WARPS)
    total = part.sum(0)  # dense dw and db: gradients autograd can keep as they are
    return (total[:ndir * dim * 4].view(ndir, dim, 4),
            total[ndir * dim * 4:].view(ndir, dim) if bias is not None else None)
