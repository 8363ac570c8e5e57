"""MLLA's attention (Triton): the feature map with the rotation, and the output.

The twins are in :mod:`mmdinomamba.ops.mlla` (same arguments, the ground truth in
the tests). Two kernels a direction, each one pass over its tensors:

* features (steps 1-2): from the projection ``[q | k]`` (batch, seqlen, 2 C), any
  float dtype, write ``[Q, K]`` and ``[Q_r, K_r]`` (2, batch, nheads, seqlen,
  headdim) in float32::

      F = ELU(x) + 1 ,  F_r = F (.) cos2 + swap(F) (.) sin2

  The backward recomputes ``ELU'`` from the projection (kept in its own dtype)
  instead of keeping ``F``::

      dx = ELU'(x) (.) (dF + dF_r (.) cos2 + swap(dF_r (.) sin2))

* output (step 6 and the epilogue): from the numerator ``N`` (batch, nheads,
  seqlen, e), the raw normaliser ``r`` (batch, nheads, seqlen, 1) and LePE's
  output ``P`` (batch, seqlen, nheads * e), write tokens-major, in the output dtype::

      out = P + N / (r + c)        (c = seqlen * eps; normalize=False: r = 0, c = seqlen)

  with the backward ``dP = dout``, ``dN = dout / (r + c)``,
  ``dr = -sum_e dout N / (r + c)^2``.
"""
import torch
import triton
import triton.language as tl

from .launch import cdiv, launch, next_power_of_2

Tensor = torch.Tensor

FEATURE_TOKENS = 16  # tokens per program of the feature kernels
OUTPUT_TOKENS = 16


# --------------------------------------------------------------------------- #
# Steps 1-2: ELU + 1 and RoPE
# --------------------------------------------------------------------------- #
@triton.jit
def _elu1(x):
    return tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))


@triton.jit
def _features_fwd_kernel(qk_ptr, cos_ptr, sin_ptr, feat_ptr, rot_ptr, batch, seqlen,
                         WIDTH: tl.constexpr, HEADDIM: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                         HAS_ROPE: tl.constexpr):
    pid_n = tl.program_id(0)
    pid = tl.program_id(1)  # which * batch + b
    which = pid // batch
    b = pid % batch
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_C)
    mask = (offs_n < seqlen)[:, None] & (offs_c < WIDTH)[None, :]
    row = (b.to(tl.int64) * seqlen + offs_n[:, None]) * (2 * WIDTH) + which * WIDTH
    x = tl.load(qk_ptr + row + offs_c[None, :], mask=mask, other=0.).to(tl.float32)
    f = _elu1(x)
    head = offs_c // HEADDIM
    chan = offs_c % HEADDIM
    # (which, b, head, n, chan) of a contiguous (2, batch, nheads, seqlen, headdim)
    out = ((pid.to(tl.int64) * (WIDTH // HEADDIM) + head[None, :]) * seqlen
           + offs_n[:, None]) * HEADDIM + chan[None, :]
    tl.store(feat_ptr + out, f, mask=mask)
    if HAS_ROPE:
        xp = tl.load(qk_ptr + row + (offs_c ^ 1)[None, :], mask=mask,
                     other=0.).to(tl.float32)
        table = (head[None, :] * seqlen + offs_n[:, None]) * HEADDIM + chan[None, :]
        cos = tl.load(cos_ptr + table, mask=mask, other=0.)
        sin = tl.load(sin_ptr + table, mask=mask, other=0.)
        tl.store(rot_ptr + out, f * cos + _elu1(xp) * sin, mask=mask)


@triton.jit
def _features_bwd_kernel(qk_ptr, cos_ptr, sin_ptr, dfeat_ptr, drot_ptr, dqk_ptr, batch,
                         seqlen, WIDTH: tl.constexpr, HEADDIM: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                         HAS_ROPE: tl.constexpr, HAS_DFEAT: tl.constexpr,
                         HAS_DROT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid = tl.program_id(1)
    which = pid // batch
    b = pid % batch
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_C)
    mask = (offs_n < seqlen)[:, None] & (offs_c < WIDTH)[None, :]
    row = (b.to(tl.int64) * seqlen + offs_n[:, None]) * (2 * WIDTH) + which * WIDTH
    x = tl.load(qk_ptr + row + offs_c[None, :], mask=mask, other=0.).to(tl.float32)
    head = offs_c // HEADDIM
    chan = offs_c % HEADDIM
    base = (pid.to(tl.int64) * (WIDTH // HEADDIM) + head[None, :]) * seqlen \
        + offs_n[:, None]
    out = base * HEADDIM + chan[None, :]
    df = tl.zeros((BLOCK_N, BLOCK_C), dtype=tl.float32)
    if HAS_DFEAT:
        df += tl.load(dfeat_ptr + out, mask=mask, other=0.)
    if HAS_DROT:
        if HAS_ROPE:
            partner = base * HEADDIM + (chan ^ 1)[None, :]
            table = (head[None, :] * seqlen + offs_n[:, None]) * HEADDIM
            cos = tl.load(cos_ptr + table + chan[None, :], mask=mask, other=0.)
            sin_p = tl.load(sin_ptr + table + (chan ^ 1)[None, :], mask=mask, other=0.)
            dr = tl.load(drot_ptr + out, mask=mask, other=0.)
            dr_p = tl.load(drot_ptr + partner, mask=mask, other=0.)
            df += dr * cos + dr_p * sin_p
        else:
            df += tl.load(drot_ptr + out, mask=mask, other=0.)
    dx = df * tl.where(x > 0, 1.0, tl.exp(tl.minimum(x, 0.0)))
    tl.store(dqk_ptr + row + offs_c[None, :], dx.to(dqk_ptr.dtype.element_ty), mask=mask)


def _feature_grid(qk: Tensor):
    return (cdiv(qk.shape[1], FEATURE_TOKENS), 2 * qk.shape[0])


class _Features(torch.autograd.Function):

    @staticmethod
    def forward(ctx, qk: Tensor, cos2, sin2, nheads: int):
        batch, seqlen, two_c = qk.shape
        width = two_c // 2
        headdim = width // nheads
        shape = (2, batch, nheads, seqlen, headdim)
        feat = qk.new_empty(shape, dtype=torch.float32)
        has_rope = cos2 is not None
        rot = qk.new_empty(shape, dtype=torch.float32) if has_rope else feat
        launch(_features_fwd_kernel)[_feature_grid(qk)](
            qk, cos2 if has_rope else feat, sin2 if has_rope else feat, feat, rot,
            batch, seqlen, WIDTH=width, HEADDIM=headdim, BLOCK_N=FEATURE_TOKENS,
            BLOCK_C=next_power_of_2(width), HAS_ROPE=has_rope)
        ctx.save_for_backward(qk, cos2, sin2)
        ctx.nheads, ctx.has_rope = nheads, has_rope
        return (feat, rot) if has_rope else feat

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dfeat, drot=None):
        qk, cos2, sin2 = ctx.saved_tensors
        batch, seqlen, two_c = qk.shape
        width = two_c // 2
        dqk = torch.empty_like(qk)
        dfeat = None if dfeat is None else dfeat.contiguous()
        drot = None if drot is None else drot.contiguous()
        some = dfeat if dfeat is not None else drot
        if some is None:
            return None, None, None, None
        launch(_features_bwd_kernel)[_feature_grid(qk)](
            qk, cos2 if ctx.has_rope else some, sin2 if ctx.has_rope else some,
            some if dfeat is None else dfeat, some if drot is None else drot, dqk,
            batch, seqlen, WIDTH=width, HEADDIM=width // ctx.nheads,
            BLOCK_N=FEATURE_TOKENS, BLOCK_C=next_power_of_2(width),
            HAS_ROPE=ctx.has_rope, HAS_DFEAT=dfeat is not None,
            HAS_DROT=drot is not None)
        return dqk, None, None, None


def mlla_features_triton(qk: Tensor, nheads: int, table=None):
    """:func:`mmdinomamba.ops.mlla.mlla_features` in one kernel (and one for the
    backward). ``qk`` (batch, seqlen, 2 C) CUDA, float32 / bfloat16 / float16;
    ``table`` float32 (nheads, seqlen, headdim) pair or None."""
    qk = qk.contiguous()
    if table is None:  # F_r is F: one output, two names
        feat = _Features.apply(qk, None, None, nheads)
        return feat, feat
    cos2, sin2 = (t.contiguous() for t in table)
    return _Features.apply(qk, cos2, sin2, nheads)


# --------------------------------------------------------------------------- #
# Step 6 and the epilogue: out = P + N / (r + c), tokens-major
# --------------------------------------------------------------------------- #
@triton.jit
def _output_fwd_kernel(num_ptr, den_ptr, lepe_ptr, out_ptr, seqlen, const,
                       NHEADS: tl.constexpr, VDIM: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_C: tl.constexpr, HAS_DEN: tl.constexpr,
                       HAS_LEPE: tl.constexpr):
    pid_n = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_C)
    mask = (offs_n < seqlen)[:, None] & (offs_c < NHEADS * VDIM)[None, :]
    head = offs_c // VDIM
    hrow = (b * NHEADS + head[None, :]) * seqlen + offs_n[:, None]  # (b, head, n)
    num = tl.load(num_ptr + hrow * VDIM + (offs_c % VDIM)[None, :], mask=mask, other=0.)
    den = tl.zeros((BLOCK_N, BLOCK_C), dtype=tl.float32) + const
    if HAS_DEN:
        den += tl.load(den_ptr + hrow, mask=mask, other=1.)
    y = num / den
    tok = (b * seqlen + offs_n[:, None]) * (NHEADS * VDIM) + offs_c[None, :]
    if HAS_LEPE:
        y = tl.load(lepe_ptr + tok, mask=mask, other=0.).to(tl.float32) + y
    tl.store(out_ptr + tok, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _output_bwd_kernel(dout_ptr, num_ptr, den_ptr, dnum_ptr, dden_ptr, seqlen, const,
                       NHEADS: tl.constexpr, VDIM: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_E: tl.constexpr, HAS_DEN: tl.constexpr):
    """One head of BLOCK_N tokens a program: dN, and dr (a sum over the head's e)."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # b * NHEADS + head
    b = bh // NHEADS
    head = bh % NHEADS
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, BLOCK_E)
    mask = (offs_n < seqlen)[:, None] & (offs_e < VDIM)[None, :]
    tok = (b * seqlen + offs_n[:, None]) * (NHEADS * VDIM) + head * VDIM + offs_e[None, :]
    dout = tl.load(dout_ptr + tok, mask=mask, other=0.).to(tl.float32)
    hrow = bh * seqlen + offs_n
    den = tl.zeros((BLOCK_N, ), dtype=tl.float32) + const
    if HAS_DEN:
        den += tl.load(den_ptr + hrow, mask=offs_n < seqlen, other=1.)
    dnum = dout / den[:, None]
    tl.store(dnum_ptr + hrow[:, None] * VDIM + offs_e[None, :], dnum, mask=mask)
    if HAS_DEN:
        num = tl.load(num_ptr + hrow[:, None] * VDIM + offs_e[None, :], mask=mask,
                      other=0.)
        dden = -tl.sum(dnum * num, 1) / den
        tl.store(dden_ptr + hrow, dden, mask=offs_n < seqlen)


class _Output(torch.autograd.Function):

    @staticmethod
    def forward(ctx, num: Tensor, den, lepe, const: float, dtype: torch.dtype):
        batch, nheads, seqlen, vdim = num.shape
        out = num.new_empty(batch, seqlen, nheads * vdim, dtype=dtype)
        launch(_output_fwd_kernel)[(cdiv(seqlen, OUTPUT_TOKENS), batch)](
            num, num if den is None else den, num if lepe is None else lepe, out,
            seqlen, const, NHEADS=nheads, VDIM=vdim, BLOCK_N=OUTPUT_TOKENS,
            BLOCK_C=next_power_of_2(nheads * vdim), HAS_DEN=den is not None,
            HAS_LEPE=lepe is not None)
        ctx.save_for_backward(num, den)
        ctx.const = const
        ctx.lepe_dtype = None if lepe is None else lepe.dtype
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        num, den = ctx.saved_tensors
        batch, nheads, seqlen, vdim = num.shape
        dout = dout.contiguous()
        dnum = torch.empty_like(num)
        dden = None if den is None else torch.empty_like(den)
        launch(_output_bwd_kernel)[(cdiv(seqlen, OUTPUT_TOKENS), batch * nheads)](
            dout, num, num if den is None else den, dnum, dnum if dden is None else dden,
            seqlen, ctx.const, NHEADS=nheads, VDIM=vdim, BLOCK_N=OUTPUT_TOKENS,
            BLOCK_E=next_power_of_2(vdim), HAS_DEN=den is not None)
        dlepe = None if ctx.lepe_dtype is None else dout.to(ctx.lepe_dtype)
        return dnum, dden, dlepe, None, None


def mlla_output_triton(num: Tensor, den, lepe, const: float,
                       dtype: torch.dtype) -> Tensor:
    """``P + N / (r + c)`` tokens-major in ``dtype`` (the twin:
    :func:`mmdinomamba.ops.mlla.mlla_output`). ``num`` (batch, nheads, seqlen, e)
    float32; ``den`` (batch, nheads, seqlen, 1) float32 or None (then ``r = 0``);
    ``lepe`` (batch, seqlen, nheads * e) or None."""
    num = num.contiguous()
    den = None if den is None else den.contiguous()
    lepe = None if lepe is None else lepe.contiguous()
    return _Output.apply(num, den, lepe, float(const), dtype)
