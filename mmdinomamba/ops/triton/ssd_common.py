"""What the SSD scan kernels share: jit helpers, tile sizes and the scan's layout.

The scan runs one Triton program per (direction, head, image) (``ssd_fwd.py``,
``ssd_bwd.py``). A program's *slot* is ``direction * nheads + head``; slots of
direction 1 scan backwards (the official "bimamba v2" backward direction: a
causal scan of the flipped sequence, here read last to first without copying).
Tensors are addressed through strides, so the kernels read and write slices of
bigger buffers (the mixer's packed projections) in place:

=========  ====================================================================
x, y, dx   (batch, seqlen, direction, head, headdim) via 4 strides, last axis dense
B, C       (batch, seqlen, direction, group, dstate) via 4 strides, last axis dense
dt         (batch, seqlen, head), raw (before bias and softplus), shared by directions
dt_bias    (slots,) float32; A (slots,) float32 (negative, or A_log with A_LOG)
D          (slots, headdim) float32, or (slots,) with D_PER_SLOT
=========  ====================================================================

Per chunk of ``CHUNK`` tokens, with ``X = x * dt`` and ``g`` the within-chunk
cumulative log-decay ``dt * A``::

    y     = (L o C B^T) X + exp(g) (C H^T) + D x        (L_ij = exp(g_i - g_j), i >= j)
    H_out = exp(g_last) H + (X * exp(g_last - g))^T B

which is :func:`mmdinomamba.ops.ssd_chunked` with the chunk loop inside the kernel.
Each token's log-decay ``dt * A`` is floored at :data:`LOG_DECAY_FLOOR`, below
which ``exp`` is 0 in float32 anyway, so no cumulative sum leaves float32's range
and no difference of two infinite sums is taken (a finite ``dt`` of any size gives
finite outputs). Tuning measurements behind the tile sizes and register caps are
in ``benchmarks/README.md``, "Kernel tuning".
"""
from typing import Dict, Optional

import torch
import triton
import triton.language as tl

from .launch import cdiv, next_power_of_2

Tensor = torch.Tensor

# exp(-104) is below float32's smallest subnormal: a token decaying by more than this
# zeroes everything before it, whatever comes later (a constexpr: kernels read it)
LOG_DECAY_FLOOR = tl.constexpr(-104.0)


@triton.jit
def softplus_fp32(x):
    """``log(1 + exp(x))`` as torch's softplus (linear above 20), with an exact log1p."""
    u = tl.exp(tl.minimum(x, 20.0))
    w = 1.0 + u
    log1p = tl.where(w == 1.0, u, tl.log(w) * u / (w - 1.0))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def _slot_A(A_ptr, slot, A_LOG: tl.constexpr):
    """The slot's A in float32: as stored, or with ``A_LOG`` ``-exp`` of the stored
    ``A_log`` (the mixer's parameter, read as it is: no host op per call)."""
    A = tl.load(A_ptr + slot).to(tl.float32)
    if A_LOG:
        A = -tl.exp(A)
    return A


@triton.jit
def _slot_D(D_ptr, slot, offs_p, mask_p, HEADDIM: tl.constexpr,
            D_PER_SLOT: tl.constexpr):
    """The slot's D for head channels ``offs_p`` in float32: a row of a (slots,
    headdim) D, or with ``D_PER_SLOT`` the slot's one value of a (slots,) D, the
    same for every channel."""
    if D_PER_SLOT:
        offs = slot + offs_p * 0
    else:
        offs = slot * HEADDIM + offs_p
    return tl.load(D_ptr + offs, mask=mask_p, other=0.).to(tl.float32)


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
    within-chunk cumulative log-decay ``g = cumsum(max(dt * A, LOG_DECAY_FLOOR))``
    and its last value."""
    raw = raw.to(tl.float32) + bias
    if DT_SOFTPLUS:
        dt = softplus_fp32(raw)
    else:
        dt = raw
    dt = tl.where(valid, dt, 0.)
    a = tl.maximum(dt * A, LOG_DECAY_FLOOR)
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


# --------------------------------------------------------------------------- #
# Host side: tiles, precision, the scan's arguments
# --------------------------------------------------------------------------- #
def block(n: int) -> int:
    """The power-of-two tile (at least 16) that holds ``n``."""
    return max(16, next_power_of_2(n))


def dot_precision(dtype: torch.dtype) -> str:
    """Triton dot precision matching torch's matmul setting for fp32 operands."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return 'ieee'
    return 'tf32'


def default_chunk(seqlen: int) -> int:
    """Tokens per forward chunk: 32, or 16 for sequences of at most 16 tokens."""
    return 16 if seqlen <= 16 else 32


def default_backward_chunk(seqlen: int) -> int:
    """Tokens per chunk of the backward kernels (they need not match the
    forward's): 64, or the sequence rounded up to a power of two (at least 16)."""
    return min(64, block(seqlen))


_SM_COUNTS: Dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (8 elsewhere); asked once per device."""
    if device.type != 'cuda':
        return 8
    index = device.index if device.index is not None else torch.cuda.current_device()
    count = _SM_COUNTS.get(index)
    if count is None:
        count = _SM_COUNTS[index] = torch.cuda.get_device_properties(
            index).multi_processor_count
    return count


# Register cap per thread of the serial-over-chunks kernels (forward scan, state
# sweeps) when there are enough programs to fill a third place per multiprocessor
OCCUPANCY_MAXNREG = 168
OCCUPANCY_PROGRAMS_PER_SM = 8


def occupancy_maxnreg(programs: int, device: torch.device) -> Optional[int]:
    """:data:`OCCUPANCY_MAXNREG` when there are more than
    :data:`OCCUPANCY_PROGRAMS_PER_SM` programs per multiprocessor, else None (no
    cap)."""
    if programs > OCCUPANCY_PROGRAMS_PER_SM * sm_count(device):
        return OCCUPANCY_MAXNREG
    return None


def strides(name: str, t: Tensor, last: str = 'h') -> Dict[str, int]:
    """The kernels' stride arguments of ``t``, a 5-d tensor called ``name`` whose
    last axis is dense (not passed): ``s_<name>b, s_<name>l, s_<name>d,
    s_<name><last>`` (image, token, direction, head; ``last='g'`` for a group), or
    ``s_<name>b, s_<name>l, s_<name>h`` for a 3-d ``t`` (dt)."""
    names = _STRIDE_NAMES.get((name, last, t.dim()))
    if names is None:
        axes = ('b', 'l', 'h') if t.dim() == 3 else ('b', 'l', 'd', last)
        names = _STRIDE_NAMES[name, last, t.dim()] = tuple(f's_{name}{a}' for a in axes)
    return dict(zip(names, t.stride()))


_STRIDE_NAMES: Dict[tuple, tuple] = {}  # the argument names of strides(), made once


class ScanArgs:
    """The tensors and layout of one scan call (see the module docstring).

    Args:
        x (Tensor): viewed as (batch, seqlen, ndir, nheads, headdim).
        B, C (Tensor): viewed as (batch, seqlen, ndir, ngroups, dstate).
        dt (Tensor): (batch, seqlen, nheads) raw steps.
        dt_bias, A (Tensor): (ndir * nheads,) float32.
        D (Tensor, optional): (ndir * nheads, headdim) float32, or (ndir * nheads,)
            (one D per head, as the mixer's).
        dt_softplus (bool): softplus the biased step.
        chunk (int): tokens per kernel chunk (a power of two >= 16).
        a_log (bool): ``A`` holds ``A_log`` (A = -exp(A_log), computed by the
            kernels), and the backward's ``dA`` is the gradient of ``A_log``.
    """

    def __init__(self, x: Tensor, B: Tensor, C: Tensor, dt: Tensor, dt_bias: Tensor,
                 A: Tensor, D, dt_softplus: bool, chunk: int, a_log: bool = False):
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
        self.a_log = a_log
        self.nslots = self.ndir * self.nheads
        self.nchunks = cdiv(self.seqlen, chunk)
        self._inputs = self._constexprs = None

    def inputs(self) -> Dict[str, object]:
        """Pointer, size and stride arguments every scan kernel takes, by name (one
        dict per call, shared by its launches: do not modify it)."""
        if self._inputs is None:
            self._inputs = dict(
                x_ptr=self.x, B_ptr=self.B, C_ptr=self.C, dt_ptr=self.dt,
                dt_bias_ptr=self.dt_bias, A_ptr=self.A, seqlen=self.seqlen,
                nheads=self.nheads, heads_per_group=self.nheads // self.ngroups,
                nslots=self.nslots, **strides('x', self.x), **strides('B', self.B, 'g'),
                **strides('C', self.C, 'g'), **strides('t', self.dt))
        return self._inputs

    def D_ptr(self) -> Tensor:
        """D, or any tensor when there is none (the kernels do not read it then)."""
        return self.D if self.D is not None else self.A

    def constexprs(self) -> Dict[str, object]:
        """The kernels' compile-time arguments (shared: copy before changing); the
        kernels that read no D take them without ``HAS_D`` and ``D_PER_SLOT``
        (:meth:`constexprs_without_D`)."""
        if self._constexprs is None:
            self._constexprs = dict(
                HEADDIM=self.headdim, DSTATE=self.dstate, CHUNK=self.chunk,
                BLOCK_P=block(self.headdim), BLOCK_N=block(self.dstate),
                DT_SOFTPLUS=self.dt_softplus, HAS_D=self.D is not None,
                D_PER_SLOT=self.D is not None and self.D.dim() == 1,
                A_LOG=self.a_log, DOT_PREC=dot_precision(self.x.dtype))
        return self._constexprs

    def constexprs_without_D(self) -> Dict[str, object]:
        """:meth:`constexprs` less the D flags: those of the kernels that read no D."""
        return {k: v for k, v in self.constexprs().items()
                if k not in ('HAS_D', 'D_PER_SLOT')}
