"""The SSD mixer after its input projection: one function, two implementations.

From the packed projection ``zxbcdt = in_proj(u)`` (order ``[z, x, B, C, dt]``) to
the mixer's output, for one (causal) or two (bidirectional, "bimamba v2")
directions::

    xBC_d = silu(conv_d(xBC))                      (depthwise, causal, kernel d_conv)
    y_d   = ssd_d(x_d, dt, A_d, B_d, C_d, D_d)     (A_d = -exp(A_log_d))
    out   = mean_d(rmsnorm(y_d * silu(z)) * w_d)
    res   = out_proj(out)

Direction 1 runs on the flipped sequence (its gate too) and is flipped back.
:func:`mixer_core_ref` computes this with the PyTorch ops one direction at a time;
:func:`mmdinomamba.ops.triton.mixer_core_triton` with fused kernels, both
directions per launch. They take the same arguments and compute the same function;
:func:`mixer_core` picks one, by the rule of :mod:`mmdinomamba.ops.backend`.
"""
import torch
import torch.nn.functional as F
from einops import rearrange

from .backend import ssd_scan, uses_fused_core
from .conv import causal_depthwise_conv1d
from .norm import gated_rms_norm
from .spec import (MixerParams, MixerSpec, at_least_float32, note_chunk_size_unused,
                   split_projection)

Tensor = torch.Tensor


def direction_ssd_inputs(zxbcdt: Tensor, params: MixerParams, spec: MixerSpec,
                         d: int) -> dict:
    """The SSD arguments of direction ``d`` from a projection already in that
    direction's token order (flipped for ``d = 1``).

    Returns:
        dict: ``x`` (batch, seqlen, nheads, headdim), ``dt`` (batch, seqlen, nheads)
        before bias and softplus, ``A`` (nheads,), ``B``, ``C`` (batch, seqlen,
        ngroups, dstate), ``D`` and ``dt_bias`` (nheads,), the gate ``z`` (batch,
        seqlen, d_inner).
    """
    z, xBC, dt = split_projection(zxbcdt, spec)
    conv_b = params.conv_b[d] if params.conv_b is not None else None
    xBC = F.silu(causal_depthwise_conv1d(xBC, params.conv_w[d], conv_b))
    gn = spec.ngroups * spec.d_state
    x, B, C = torch.split(xBC, [spec.d_inner, gn, gn], dim=-1)
    A_log = params.A_log[d]
    return dict(
        x=rearrange(x, 'b l (h p) -> b l h p', p=spec.headdim),
        dt=dt,
        A=-torch.exp(at_least_float32(A_log)),
        B=rearrange(B, 'b l (g n) -> b l g n', g=spec.ngroups),
        C=rearrange(C, 'b l (g n) -> b l g n', g=spec.ngroups),
        D=params.D[d], dt_bias=params.dt_bias[d], z=z)


def mixer_core_ref(zxbcdt: Tensor, params: MixerParams, spec: MixerSpec) -> Tensor:
    """The mixer after ``in_proj`` with PyTorch ops, one direction at a time.

    Args:
        zxbcdt (Tensor): (batch, seqlen, 2 * d_inner + 2 * ngroups * d_state +
            nheads), the output of ``in_proj``.
        params (MixerParams): the parameters.
        spec (MixerSpec): sizes; ``chunk_size`` and ``ssd_backend`` of the scan.

    Returns:
        Tensor: (batch, seqlen, dim).
    """
    ys = []
    for d in range(spec.ndir):
        proj = zxbcdt.flip(1) if d == 1 else zxbcdt
        a = direction_ssd_inputs(proj, params, spec, d)
        y = ssd_scan(a['x'], a['dt'], a['A'], a['B'], a['C'], chunk_size=spec.chunk_size,
                     D=a['D'], dt_bias=a['dt_bias'], dt_softplus=True,
                     backend=spec.ssd_backend)
        y = gated_rms_norm(rearrange(y, 'b l h p -> b l (h p)'), a['z'],
                           params.norm_w[d], spec.eps, spec.d_inner // spec.ngroups)
        ys.append(y.flip(1) if d == 1 else y)
    y = ys[0] if spec.ndir == 1 else (ys[0] + ys[1]) / 2
    return F.linear(y, params.out_w, params.out_b)


def mixer_core(zxbcdt: Tensor, params: MixerParams, spec: MixerSpec) -> Tensor:
    """The mixer after ``in_proj``: the fused kernels where they apply
    (:func:`mmdinomamba.ops.backend.uses_fused_core`), else :func:`mixer_core_ref`.
    Same arguments and result as :func:`mixer_core_ref`."""
    if uses_fused_core(zxbcdt, spec):
        note_chunk_size_unused(spec.chunk_size, 'SSD mixer (fused Triton core)')
        from .triton import mixer_core_triton
        return mixer_core_triton(zxbcdt, params, spec)
    return mixer_core_ref(zxbcdt, params, spec)
