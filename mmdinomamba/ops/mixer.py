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
:func:`mixer_core` picks one.
"""
from typing import NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from einops import rearrange

from .conv import causal_depthwise_conv1d
from .fused import triton_takes
from .norm import gated_rms_norm
from .ssd import resolve_backend, ssd

Tensor = torch.Tensor


def auto_chunk_size(seqlen: int) -> int:
    """The PyTorch scan's chunk for ``chunk_size='auto'``: the whole sequence up to
    128 tokens, else 64. The intra-chunk step costs seqlen x chunk and the chunk
    count adds steps, so both ends lose (CPU, 256-wide DinoVim, 4 layers, forward +
    backward, batch 2, one thread: 258 tokens 489 ms with chunk 64, 1105 ms with
    256; 66 tokens 119 ms in one chunk, 212 ms with chunk 64)."""
    return seqlen if seqlen <= 128 else 64


class MixerSpec(NamedTuple):
    """Sizes and settings of a mixer (see :class:`mmdinomamba.models.mixers.SSDMixer`).

    ``chunk_size`` (tokens, or 'auto': :func:`auto_chunk_size`) and ``ssd_backend``
    choose how the PyTorch path scans; the fused path is the 'triton' backend with
    tiles of its own.
    """
    d_inner: int
    ngroups: int
    d_state: int
    headdim: int
    ndir: int
    eps: float
    d_conv: int = 4
    chunk_size: Union[int, str] = 'auto'
    ssd_backend: str = 'auto'

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state


class MixerParams(NamedTuple):
    """The mixer's parameters after ``in_proj``: per direction (forward first) a
    tuple entry, as the module holds them (no copies).

    Attributes:
        conv_w: each (conv_dim, 1, d_conv), ``nn.Conv1d`` layout.
        conv_b: each (conv_dim,), or None (no conv bias).
        dt_bias, A_log, D: each (nheads,).
        norm_w: each (d_inner,), the gated norm's scale.
        out_w (Tensor): (dim, d_inner), ``out_proj`` weight.
        out_b (Tensor, optional): (dim,).
    """
    conv_w: Tuple[Tensor, ...]
    conv_b: Optional[Tuple[Tensor, ...]]
    dt_bias: Tuple[Tensor, ...]
    A_log: Tuple[Tensor, ...]
    D: Tuple[Tensor, ...]
    norm_w: Tuple[Tensor, ...]
    out_w: Tensor
    out_b: Optional[Tensor]


def split_projection(zxbcdt: Tensor, spec: MixerSpec) -> Tuple[Tensor, Tensor, Tensor]:
    """The gate z (..., d_inner), the conv input xBC (..., conv_dim) and the raw
    steps dt (..., nheads) of the packed projection (views)."""
    return torch.split(zxbcdt, [spec.d_inner, spec.conv_dim, spec.nheads], dim=-1)


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
        A=-torch.exp(A_log.to(torch.promote_types(A_log.dtype, torch.float32))),
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
    chunk = auto_chunk_size(zxbcdt.shape[1]) if spec.chunk_size == 'auto' \
        else spec.chunk_size
    ys = []
    for d in range(spec.ndir):
        proj = zxbcdt.flip(1) if d == 1 else zxbcdt
        a = direction_ssd_inputs(proj, params, spec, d)
        y = ssd(a['x'], a['dt'], a['A'], a['B'], a['C'], chunk_size=chunk,
                D=a['D'], dt_bias=a['dt_bias'], dt_softplus=True,
                backend=spec.ssd_backend)
        y = gated_rms_norm(rearrange(y, 'b l h p -> b l (h p)'), a['z'],
                           params.norm_w[d], spec.eps, spec.d_inner // spec.ngroups)
        ys.append(y.flip(1) if d == 1 else y)
    y = ys[0] if spec.ndir == 1 else (ys[0] + ys[1]) / 2
    return F.linear(y, params.out_w, params.out_b)


def uses_fused_core(zxbcdt: Tensor, spec: MixerSpec) -> bool:
    """Whether :func:`mixer_core` takes the fused Triton path for this input: CUDA,
    a Triton dtype, ``d_conv = 4`` and an SSD backend of 'auto' or 'triton'.

    Under ``torch.compile`` too: there the kernels run as the custom ops of
    :mod:`mmdinomamba.ops.triton.mixer`, one node of the graph each.
    """
    if spec.ssd_backend not in ('auto', 'triton') or spec.d_conv != 4:
        return False
    if not triton_takes(zxbcdt):
        return False
    return resolve_backend(spec.ssd_backend, zxbcdt.device) == 'triton'


def mixer_core(zxbcdt: Tensor, params: MixerParams, spec: MixerSpec) -> Tensor:
    """The mixer after ``in_proj``: the fused kernels where they apply
    (:func:`uses_fused_core`), else :func:`mixer_core_ref`. Same arguments and
    result as :func:`mixer_core_ref`."""
    if uses_fused_core(zxbcdt, spec):
        from .triton import mixer_core_triton
        return mixer_core_triton(zxbcdt, params, spec)
    return mixer_core_ref(zxbcdt, params, spec)
