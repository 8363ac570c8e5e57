"""The Mamba-2 (SSD) token mixer, causal or bidirectional ("bimamba v2")."""
from typing import Dict, Optional, Tuple, Union

import torch
import torch.nn as nn
from einops import rearrange

from mmdinomamba.models.utils import init_dt_bias
from mmdinomamba.ops import (BACKENDS, CHUNK_SIZE, MixerParams, MixerSpec, RMSNorm,
                             check_chunk_size, check_finite, direction_ssd_inputs,
                             mixer_core, ssd_decay_mask, ssd_mixing_matrix,
                             uses_fused_core)
from mmdinomamba.utils.arg_types import check_arg_types
from .protocol import Grid, MixerInfo

Tensor = torch.Tensor

# Per-direction parameter names, as in the official Dino-Mamba checkpoints.
_DIRECTION_NAMES = {
    'forward': dict(conv1d='conv1d', dt_bias='dt_bias', A_log='A_log', D='D',
                    norm='norm'),
    'backward': dict(conv1d='conv1d_b', dt_bias='dt_b_bias', A_log='A_log_b',
                     D='D_b', norm='norm_b'),
}


class SSDMixer(nn.Module):
    """Mamba-2 mixer: ``(batch, seqlen, dim) -> (batch, seqlen, dim)``.

    Named after the operation it computes (state space duality, SSD) rather than
    the Mamba block, since here it is only the token mixer of a pre-norm block.
    With ``bidirectional=True`` it is the "bimamba v2" mixer of the official
    DinoVim: one shared input projection ``in_proj`` (order ``[z, x, B, C, dt]``)
    and output projection ``out_proj``; per direction a depthwise causal
    ``conv1d`` over ``[x, B, C]`` with SiLU, ``dt_bias``, ``A_log``, ``D`` and a
    gated RMSNorm. The backward direction reads the flipped sequence (the gate
    ``z`` too) and is flipped back; the two directions are averaged before
    ``out_proj``. Parameter names follow the official layout, so released
    checkpoints load one-to-one.

    Everything after ``in_proj`` (both directions' conv + SiLU, SSD scans and
    gated norms, the average, and ``out_proj``) is one function,
    :func:`mmdinomamba.ops.mixer_core`: on CUDA with ``ssd_backend`` 'auto' or
    'triton' (and ``d_conv=4``) fused Triton kernels, elsewhere the PyTorch ops one
    direction at a time (:func:`mmdinomamba.ops.mixer_core_ref`). Both compute
    the same function.

    Args:
        dim (int): model width (``d_model``).
        d_state (int): SSM state size N. Defaults to 64.
        d_conv (int): depthwise conv kernel. Defaults to 4.
        expand (int): inner width is ``expand * dim``. Defaults to 2.
        headdim (int): channels per SSM head. Defaults to 64.
        ngroups (int): groups of heads sharing B and C. Defaults to 1.
        A_init_range (tuple): A is drawn from U(A_init_range). Defaults to (1, 16).
        dt_min, dt_max (float): dt is drawn log-uniformly in [dt_min, dt_max].
        dt_init_floor (float): lower clamp of the initial dt. Defaults to 1e-4.
        bias (bool): bias in the projections. Defaults to False.
        conv_bias (bool): bias in the conv. Defaults to True.
        chunk_size (int | str): chunk of the PyTorch scan, or 'auto' (the whole
            sequence up to 128 tokens, else 64: :func:`mmdinomamba.ops.spec.auto_chunk_size`).
            It changes no weight, and no result beyond rounding; the fused Triton
            path tiles by itself and says once that an explicit value is unused.
            Defaults to :data:`mmdinomamba.ops.spec.CHUNK_SIZE` ('auto').
        bidirectional (bool): add the backward direction. Defaults to True.
        ssd_backend (str): see :data:`mmdinomamba.ops.BACKENDS`. Defaults to 'auto'.
        norm_eps (float): eps of the gated RMSNorm. Defaults to 1e-5.
    """

    def __init__(self,
                 dim: int,
                 d_state: int = 64,
                 d_conv: int = 4,
                 expand: int = 2,
                 headdim: int = 64,
                 ngroups: int = 1,
                 A_init_range: Tuple[float, float] = (1, 16),
                 dt_min: float = 0.001,
                 dt_max: float = 0.1,
                 dt_init_floor: float = 1e-4,
                 bias: bool = False,
                 conv_bias: bool = True,
                 chunk_size: Union[int, str] = CHUNK_SIZE,
                 bidirectional: bool = True,
                 ssd_backend: str = 'auto',
                 norm_eps: float = 1e-5,
                 device=None,
                 dtype=None):
        check_arg_types(SSDMixer, locals(), 'SSDMixer')  # config values' types
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        self.dim = dim
        self.d_inner = expand * dim
        if self.d_inner % headdim != 0:
            raise ValueError(f'SSDMixer: headdim ({headdim}) must divide the inner '
                             f'width expand * dim = {self.d_inner}')
        self.nheads = self.d_inner // headdim
        if self.nheads % ngroups != 0:
            raise ValueError(f'SSDMixer: ngroups ({ngroups}) must divide nheads '
                             f'({self.nheads})')
        if ssd_backend not in BACKENDS:
            raise ValueError(f'SSDMixer: unknown ssd_backend {ssd_backend!r}; '
                             f'choose one of {BACKENDS}')
        check_chunk_size(chunk_size, 'SSDMixer')
        if A_init_range[0] <= 0 or A_init_range[1] < A_init_range[0]:
            raise ValueError(f'SSDMixer: A_init_range must be 0 < low <= high, '
                             f'got {A_init_range}')
        self.headdim = headdim
        self.d_state = d_state
        self.ngroups = ngroups
        self.d_conv = d_conv
        self.chunk_size = chunk_size
        self.bidirectional = bidirectional
        self.ssd_backend = ssd_backend
        self.conv_dim = self.d_inner + 2 * ngroups * d_state

        # Order: [z, x, B, C, dt]
        self.in_proj = nn.Linear(dim, 2 * self.d_inner + 2 * ngroups * d_state +
                                 self.nheads, bias=bias, **dd)
        self.out_proj = nn.Linear(self.d_inner, dim, bias=bias, **dd)
        directions = ('forward', 'backward') if bidirectional else ('forward', )
        for direction in directions:
            names = _DIRECTION_NAMES[direction]
            self.add_module(names['conv1d'], nn.Conv1d(
                self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim,
                padding=d_conv - 1, bias=conv_bias, **dd))
            self.register_parameter(names['dt_bias'], nn.Parameter(
                init_dt_bias(self.nheads, dt_min, dt_max, dt_init_floor, **dd)))
            A = torch.empty(self.nheads, dtype=torch.float32,
                            device=device).uniform_(*A_init_range)
            self.register_parameter(names['A_log'],
                                    nn.Parameter(torch.log(A).to(dtype)))
            self.register_parameter(names['D'], nn.Parameter(
                torch.ones(self.nheads, device=device)))
            self.add_module(names['norm'], RMSNorm(
                self.d_inner, eps=norm_eps, group_size=self.d_inner // ngroups,
                **dd))
        self.directions = directions

    @property
    def spec(self) -> MixerSpec:
        """Sizes and scan settings, as :func:`mmdinomamba.ops.mixer_core` takes them."""
        return MixerSpec(self.d_inner, self.ngroups, self.d_state, self.headdim,
                         len(self.directions), self.norm.eps, self.d_conv,
                         self.chunk_size, self.ssd_backend)

    def core_params(self) -> MixerParams:
        """The parameters after ``in_proj``, per direction (forward first), as held.

        Read from the modules' ``_parameters`` and ``_modules`` dicts, where
        ``nn.Module.__getattr__`` looks them up (once per forward: 22 Python calls
        of it per layer otherwise)."""
        own, mods = self._parameters, self._modules
        names = [_DIRECTION_NAMES[d] for d in self.directions]
        convs = [mods[n['conv1d']]._parameters for n in names]
        out = mods['out_proj']._parameters
        return MixerParams(
            conv_w=tuple(c['weight'] for c in convs),
            conv_b=tuple(c['bias'] for c in convs) if convs[0]['bias'] is not None
            else None,
            dt_bias=tuple(own[n['dt_bias']] for n in names),
            A_log=tuple(own[n['A_log']] for n in names),
            D=tuple(own[n['D']] for n in names),
            norm_w=tuple(mods[n['norm']]._parameters['weight'] for n in names),
            out_w=out['weight'], out_b=out['bias'])

    def ssd_inputs(self, zxbcdt: Tensor, direction: str) -> Dict[str, Tensor]:
        """The SSD arguments of one direction, from the (already flipped) projection
        (see :func:`mmdinomamba.ops.direction_ssd_inputs`).

        Args:
            zxbcdt (Tensor): (batch, seqlen, d_in_proj), output of ``in_proj``.
            direction (str): 'forward' or 'backward'.

        Returns:
            dict: ``x`` (batch, seqlen, nheads, headdim), ``dt`` (batch, seqlen,
            nheads) before bias and softplus, ``A`` (nheads,), ``B``, ``C``
            (batch, seqlen, ngroups, dstate), ``D`` (nheads,), ``dt_bias``
            (nheads,) and the gate ``z`` (batch, seqlen, d_inner).
        """
        return direction_ssd_inputs(zxbcdt, self.core_params(), self.spec,
                                    self.directions.index(direction))

    def forward(self, u: Tensor, hw: Optional[Grid] = None) -> Tensor:
        """Mix tokens.

        Args:
            u (Tensor): (batch, seqlen, dim).
            hw (tuple, optional): the token grid; ignored (the scan needs none).

        Returns:
            Tensor: (batch, seqlen, dim).
        """
        if u.dim() != 3 or u.shape[-1] != self.dim:
            raise ValueError(f'SSDMixer: input must have shape (batch, seqlen, '
                             f'{self.dim}), got {tuple(u.shape)}')
        if u.shape[1] == 0:
            raise ValueError(f'SSDMixer: the input has no tokens (seqlen 0, shape '
                             f'{tuple(u.shape)}); give it at least one token')
        check_finite(u, 'SSDMixer: the input')
        return mixer_core(self.in_proj(u), self.core_params(), self.spec)

    def uses_fused_path(self, zxbcdt: Tensor) -> bool:
        """Whether :meth:`forward` takes the fused Triton path for this input."""
        return uses_fused_core(zxbcdt, self.spec)

    # ------------------------------------------ mixing-matrix protocol (analysis)
    def mixing_info(self) -> MixerInfo:
        """Kind 'ssd', ``nheads`` heads, state size N = ``d_state``; one matrix per
        direction ('forward', and 'backward' when bidirectional)."""
        return MixerInfo('ssd', self.nheads, self.d_state, tuple(self.directions))

    def _direction_inputs(self, u: Tensor):
        """(direction, flipped, SSD inputs of that direction) for each direction."""
        zxbcdt = self.in_proj(u)
        for direction in self.directions:
            flip = direction == 'backward'
            yield direction, flip, self.ssd_inputs(zxbcdt.flip(1) if flip else zxbcdt,
                                                   direction)

    def mixing_matrices(self, u: Tensor, hw: Optional[Grid] = None) -> Dict[str, Tensor]:
        """The SSD token-mixing matrix of each direction, in sequence order.

        For direction ``d``, ``M_d`` satisfies ``ssd(x_d, ...) = M_d x_d`` per head,
        before the gated norm and ``out_proj`` (``x_d`` is the conv output of that
        direction, unflipped: :meth:`mixing_values`). The backward matrix is
        flipped back to sequence order, so it is upper triangular.

        Args:
            u (Tensor): (batch, seqlen, dim).

        Returns:
            dict: ``'forward'`` (and ``'backward'``): (batch, nheads, seqlen, seqlen).
        """
        out = {}
        for direction, flip, a in self._direction_inputs(u):
            M = ssd_mixing_matrix(a['dt'], a['A'], a['B'], a['C'], D=a['D'],
                                  dt_bias=a['dt_bias'], dt_softplus=True)
            out[direction] = M.flip(-1).flip(-2) if flip else M
        return out

    def mixing_values(self, u: Tensor, hw: Optional[Grid] = None) -> Dict[str, Tensor]:
        """The values ``x_d`` of each direction (its conv1d + SiLU output), in
        sequence order: ``M_d x_d`` is the SSD output (``D`` skip included) that
        enters that direction's gated RMSNorm.

        Args:
            u (Tensor): (batch, seqlen, dim).

        Returns:
            dict: ``'forward'`` (and ``'backward'``): (batch, nheads, seqlen, headdim).
        """
        out = {}
        for direction, flip, a in self._direction_inputs(u):
            x = a['x'].flip(1) if flip else a['x']
            out[direction] = rearrange(x, 'b l h p -> b h l p')
        return out

    def decay_masks(self, u: Tensor) -> Dict[str, Tensor]:
        """The learnable mask ``L`` of each direction, in sequence order.

        Args:
            u (Tensor): (batch, seqlen, dim).

        Returns:
            dict: ``'forward'`` (and ``'backward'``, upper triangular) ->
            (batch, nheads, seqlen, seqlen), from :func:`mmdinomamba.ops.ssd_decay_mask`.
        """
        out = {}
        for direction, flip, a in self._direction_inputs(u):
            L = ssd_decay_mask(a['dt'], a['A'], a['dt_bias'], dt_softplus=True)
            out[direction] = L.flip(-1).flip(-2) if flip else L
        return out

    def extra_repr(self) -> str:
        return (f'dim={self.dim}, d_state={self.d_state}, nheads={self.nheads}, '
                f'headdim={self.headdim}, ngroups={self.ngroups}, '
                f'bidirectional={self.bidirectional}, ssd_backend={self.ssd_backend!r}')

