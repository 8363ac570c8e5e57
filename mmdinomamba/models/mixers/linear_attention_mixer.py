"""Linear attention on a token grid, with Mamba's designs as switches (MLLA's mixer).

"Demystify Mamba in Vision: A Linear Attention Perspective" (Han et al., NeurIPS
2024, https://arxiv.org/abs/2405.16605) reads Mamba as linear attention plus six
designs. :class:`LinearAttentionMixer` is that linear attention with the designs
that live inside the token mixer as switches; MLLA's attention is
``LinearAttentionMixer(dim, num_heads, rope=True, lepe=True)``. The block design
and the conditional position encoding (CPE) belong to the block, the absolute
position embedding (APE) to the backbone.

Notation, per head ``h``: ``d = qk_dim / num_heads`` query/key channels and
``e = dim / num_heads`` value channels (contiguous slices; ``qk_dim = dim`` unless
set, so ``d = e``), ``N`` tokens on an ``(H, W)`` grid in raster order, input ``u``
(N, dim)::

    [q | k] = u W_qk + b_qk                           first qk_dim = q, last = k
    Q = ELU(q) + 1 ,  K = ELU(k) + 1                  every entry > 0
    V = u W_v + b_v  (value_proj)  or  V = u          MLLA: no value projection
    Q_r, K_r = RoPE2D(Q), RoPE2D(K)  (rope)           over all qk_dim channels, before
                                                      the head split (positional.rope_2d;
                                                      one cos / sin table per grid, see
                                                      LinearAttentionMixer.rope_table)
    G = Delta (.) V ,  Delta = softplus(u W_1 W_2 + b)   (input_gate), else G = V
    w_ij = Q_r,i . K_r,j                              per head
    n_ij = Q_i . K_j                                  per head, un-rotated
    forget gate: w_ij, n_ij <- L_ij w_ij, L_ij n_ij for j <= i, 0 for j > i, with
        L_ij = exp(cs_i - cs_j) ,  cs_i = sum_(t<=i) l_t ,
        l_t = -exp(A_log) softplus(u_t W_dt + dt_bias) <= 0      (the log-decay)
      per head and token ('head': Mamba-2's scalar decay), or per key channel
      ('channel': gated linear attention; w_ij = sum_c Q_r,ic K_r,jc L_ij,c and
      n_ij likewise)
    y_i = sum_j w_ij G_j / (sum_j n_ij + N eps)       (normalize)
    y_i = sum_j w_ij G_j / N                          (normalize=False)
    y  <- y + D (.) V                                 (shortcut)
    y  <- y + DW3_lepe(V)                             (lepe: depthwise 3x3 conv on V)

The attention term is computed by :mod:`mmdinomamba.ops.mlla` (its steps and
notation): without the forget gate the sums run over all tokens and are computed in
O(N d e) by associativity (the normaliser then is MLLA's ``1 / (Q_i . mean_j K_j +
eps)``); with it the attention is causal in raster order and recurrent
(``S_i = diag(a_i) S_(i-1) + K_r,i^T G_i``), computed in chunks from the log-decay.
``attn_backend='ref'`` takes the ops' slow twins (the mixing matrix, the
token-by-token recurrence, RoPE per tensor).

Mixing matrices (the protocol of :mod:`.protocol`, kind ``'mlla'``):

- ``'attention'`` (batch, num_heads, N, N): ``A_h[i, j] = w_ij / (sum_j n_ij + N eps)``
  (or ``w_ij / N``), acting on ``G`` per head: ``A_h G_h`` is the attention term.
  Rank <= d (RoPE rotates the two factors token by token and the normaliser scales
  rows); with the forget gate it is ``d``-semiseparable and generically full rank.
- ``'whole'`` (batch, dim, N, N), per channel ``c`` of head ``h`` (present when a
  per-channel term is on: lepe, shortcut or input_gate)::

      M^(c) = A_h diag(Delta[:, c]) + P_c + D_c I

  with ``P_c`` the LePE stencil (:func:`.positional.depthwise_conv_matrix`),
  acting on ``V[:, c]``; ``M^(c) V[:, c] + b_lepe[c]`` is channel ``c`` of the
  mixer's output. The stencil makes it generically full rank; a block of c tokens
  within ``W + 1`` raster positions of the diagonal has rank <= d + min(c, W + 1),
  a block farther away rank <= d.
"""
import math
from typing import Dict, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmdinomamba.models.utils import init_dt_bias
from mmdinomamba.ops import check_finite, float32_or_wider
from mmdinomamba.ops.mlla import (ATTENTION_BACKENDS, HeadTable, gla_mixing_matrix,
                                  linear_attention_parts, mlla_features_auto,
                                  mlla_features_ref, mlla_mixing_matrix, mlla_output,
                                  rope_head_table, values_per_head)
from mmdinomamba.utils.arg_types import check_arg_types
from .positional import depthwise_conv_matrix, grid_conv, rope_2d, rope_2d_table
from .protocol import Grid, MixerInfo, require_grid

Tensor = torch.Tensor

FORGET_GATES = ('head', 'channel')
DT_INIT_FLOOR = 1e-4  # the smallest initial forget-gate step (initialisation only)
LEPE_KERNEL = 3


def _forget_gate(value: Union[bool, str, None]) -> Optional[str]:
    """The forget gate's form: None (off), 'head' or 'channel' (True = 'head')."""
    if value is None or value is False:
        return None
    if value is True:
        return 'head'
    if value not in FORGET_GATES:
        raise ValueError(f'LinearAttentionMixer: unknown forget_gate {value!r}; choose '
                         f'False, True (= \'head\') or one of {FORGET_GATES}')
    return value


class LinearAttentionMixer(nn.Module):
    """``(batch, H * W, dim) -> (batch, H * W, dim)``: linear attention with switches.

    See the module docstring for the equations. Parameter names: ``qk`` (and ``v``)
    as in MLLA's checkpoints, ``lepe``; ``delta_proj`` (input gate); ``dt_proj``,
    ``dt_bias``, ``A_log`` (forget gate); ``D`` (shortcut).

    Args:
        dim (int): width (of the input, the values and the output).
        num_heads (int): heads; must divide ``dim`` and ``qk_dim``.
        qkv_bias (bool): bias of the q/k (and v) projections. Defaults to True.
        qk_dim (int, optional): width of Q and K, split over the heads; None =
            ``dim``. Mamba's single head is ``num_heads=1`` with a narrow
            ``qk_dim`` (its state size): one Q and one K shared by every value
            channel. Defaults to None.
        value_proj (bool): project the values (``V = u W_v``); MLLA reads ``V = u``.
            Defaults to False.
        rope (bool): 2-D RoPE on Q and K over the full width (``dim`` a multiple
            of 4). Defaults to False.
        lepe (bool): add the locally-enhanced positional encoding, a depthwise
            3x3 conv of V. Defaults to False.
        normalize (bool): divide by the attention normaliser. Defaults to True.
        input_gate (bool): scale V per token and channel by
            ``Delta = softplus(u W_1 W_2 + b)`` (rank ``ceil(dim / 16)``, as
            Mamba's step; ``Delta = 1`` at initialisation). Defaults to False.
        forget_gate (bool | str): a decay per token, making the attention causal:
            'head' (or True): one scalar per head, Mamba-2's form; 'channel': one
            per key channel, gated linear attention's (``qk_dim`` decays, each with
            its own ``A_log`` and ``dt_bias``). Defaults to False.
        shortcut (bool): add ``D (.) V`` with a learnable ``D`` per channel
            (initialised to 1). Defaults to False.
        eps (float): added to the mean normaliser. Defaults to 1e-6.
        attn_backend (str): 'auto' (the fast path of :mod:`mmdinomamba.ops.mlla`)
            or 'ref' (its slow twins: the mixing matrix or the recurrence, RoPE
            per tensor). Defaults to 'auto'.
    """

    def __init__(self,
                 dim: int,
                 num_heads: int,
                 qkv_bias: bool = True,
                 qk_dim: Optional[int] = None,
                 value_proj: bool = False,
                 rope: bool = False,
                 lepe: bool = False,
                 normalize: bool = True,
                 input_gate: bool = False,
                 forget_gate: Union[bool, str] = False,
                 shortcut: bool = False,
                 eps: float = 1e-6,
                 attn_backend: str = 'auto'):
        check_arg_types(LinearAttentionMixer, locals(), 'LinearAttentionMixer')
        super().__init__()
        qk_dim = dim if qk_dim is None else qk_dim
        if num_heads < 1 or dim % num_heads or qk_dim % num_heads:
            raise ValueError(f'LinearAttentionMixer: num_heads ({num_heads}) must '
                             f'divide dim ({dim}) and qk_dim ({qk_dim})')
        if rope and (qk_dim % 4 or (qk_dim // num_heads) % 2):
            raise ValueError(f'LinearAttentionMixer: rope needs qk_dim ({qk_dim}) to '
                             'be a multiple of 4 (channel pairs for rows and columns) '
                             'and an even number of channels per head')
        if attn_backend not in ATTENTION_BACKENDS:
            raise ValueError(f'LinearAttentionMixer: unknown attn_backend '
                             f'{attn_backend!r}; choose one of {ATTENTION_BACKENDS}')
        self.dim = dim
        self.qk_dim = qk_dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads  # value channels per head
        self.qk_head_dim = qk_dim // num_heads
        self.rope = rope
        self.normalize = normalize
        self.eps = eps
        self.attn_backend = attn_backend
        self.forget_gate = _forget_gate(forget_gate)
        self.qk = nn.Linear(dim, 2 * qk_dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias) if value_proj else None
        self.lepe = nn.Conv2d(dim, dim, LEPE_KERNEL, padding=LEPE_KERNEL // 2,
                              groups=dim) if lepe else None
        self.delta_proj = None
        if input_gate:
            rank = math.ceil(dim / 16)
            self.delta_proj = nn.Sequential(nn.Linear(dim, rank, bias=False),
                                            nn.Linear(rank, dim))
        self.dt_proj = None
        if self.forget_gate is not None:
            decays = num_heads if self.forget_gate == 'head' else qk_dim
            self.dt_proj = nn.Linear(dim, decays, bias=False)
            self.dt_bias = nn.Parameter(init_dt_bias(decays, 1e-3, 0.1, DT_INIT_FLOOR))
            A = torch.empty(decays).uniform_(1, 16)
            self.A_log = nn.Parameter(torch.log(A))
        self.D = nn.Parameter(torch.ones(dim)) if shortcut else None
        self.init_gates()

    @torch.no_grad()
    def init_gates(self) -> None:
        """Input gate ``Delta = 1`` at initialisation (``b = softplus^-1(1)``,
        ``W_2 = 0``): the gated mixer starts as the ungated one. A backbone that
        re-initialises every Linear calls this afterwards."""
        if self.delta_proj is not None:
            nn.init.zeros_(self.delta_proj[1].weight)
            nn.init.constant_(self.delta_proj[1].bias, math.log(math.e - 1))

    # ------------------------------------------------------------------ pieces
    def _check(self, u: Tensor, hw: Optional[Grid]) -> Grid:
        """``u``'s shape and its grid ``hw`` (which this mixer needs), as ints."""
        if u.dim() != 3 or u.shape[-1] != self.dim:
            raise ValueError(f'LinearAttentionMixer: input must have shape (batch, '
                             f'H * W, {self.dim}), got {tuple(u.shape)}')
        return require_grid(hw, u.shape[1], 'LinearAttentionMixer')

    def rope_table(self, hw: Tuple[int, int], like: Tensor) -> Optional[HeadTable]:
        """The RoPE table of this mixer's width and heads on the grid ``hw``
        (:func:`mmdinomamba.ops.mlla.rope_head_table`), for inputs like ``like``
        (its device; float64 for float64, else float32), or None without RoPE.
        Mixers of one width on one grid (the blocks of an MLLA stage) share one
        table: build it once per forward and pass it to each.

        Returns:
            tuple: (cos2, sin2), each (num_heads, H * W, qk_dim / num_heads); or None.
        """
        if not self.rope:
            return None
        cos, sin = rope_2d_table(hw, self.qk_dim, device=like.device,
                                 dtype=float32_or_wider(like.dtype))
        return rope_head_table(cos, sin, self.num_heads)

    def _log_decay(self, u: Tensor) -> Optional[Tensor]:
        """The forget gate's log-decay ``l`` (batch, num_heads, N, 1 or d) in the
        compute dtype, or None without the gate."""
        if self.dt_proj is None:
            return None
        dtype = float32_or_wider(u.dtype)
        dt = F.softplus(self.dt_proj(u).to(dtype) + self.dt_bias.to(dtype))
        log_decay = -torch.exp(self.A_log.to(dtype)) * dt  # (batch, N, decays)
        return log_decay.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)

    def _values(self, u: Tensor) -> Tuple[Tensor, Optional[Tensor], Tensor]:
        """V (batch, N, dim), Delta (or None) and G = Delta (.) V, in u's dtype."""
        v = self.v(u) if self.v is not None else u
        delta = F.softplus(self.delta_proj(u)) if self.delta_proj is not None else None
        return v, delta, (v * delta if delta is not None else v)

    def _parts(self, u: Tensor, hw) -> Dict[str, Tensor]:
        """The slow twin's pieces: Q, K, Q_r, K_r (batch, num_heads, N, d) and G
        (batch, num_heads, N, e) per head in float32 (float64 for float64 input),
        RoPE applied to Q and K each with a table of its own; V (batch, N, dim) and
        Delta in the input's dtype; the log-decay (or None)."""
        hw = self._check(u, hw)
        rotate = (lambda t: rope_2d(t, hw)) if self.rope else None
        (q, k), (q_r, k_r) = mlla_features_ref(self.qk(u), self.num_heads, rotate)
        v, delta, g = self._values(u)
        return dict(q=q, k=k, q_r=q_r, k_r=k_r, g=values_per_head(g, self.num_heads),
                    v=v, delta=delta, log_decay=self._log_decay(u))

    def _extra(self, v: Tensor, hw) -> Optional[Tensor]:
        """What the output adds to the attention term: LePE's convolution of V
        and the shortcut ``D (.) V``, (batch, N, dim) tokens-major, or None."""
        extra = grid_conv(self.lepe, v, hw) if self.lepe is not None else None
        if self.D is not None:
            with torch.autocast(v.device.type, enabled=False):
                dtype = float32_or_wider(v.dtype)
                shortcut = v.to(dtype) * self.D.to(dtype)
            extra = shortcut if extra is None else extra + shortcut
        return extra

    def forward(self, u: Tensor, hw: Optional[Grid] = None,
                rope_table: Optional[HeadTable] = None) -> Tensor:
        """Mix tokens.

        Args:
            u (Tensor): (batch, H * W, dim), tokens in raster order.
            hw (tuple): the grid (H, W); required (the protocol's optional
                argument, which this mixer needs).
            rope_table (tuple, optional): :meth:`rope_table` of this grid, shared
                by the mixers that run on it; None builds it in this call.

        Returns:
            Tensor: (batch, H * W, dim) in u's dtype.
        """
        check_finite(u, 'LinearAttentionMixer: the input')
        if self.attn_backend == 'ref':
            hw = self._check(u, hw)
            p = self._parts(u, hw)
            q, k, q_r, k_r, g, v = (p[key] for key in ('q', 'k', 'q_r', 'k_r', 'g', 'v'))
            log_decay = p['log_decay']
        else:
            hw = self._check(u, hw)
            if self.rope and rope_table is None:
                rope_table = self.rope_table(hw, u)
            qk = self.qk(u)
            v, _, g = self._values(u)
            log_decay = self._log_decay(u)
        # sums over all tokens: in float32 even under autocast
        with torch.autocast(u.device.type, enabled=False):
            if self.attn_backend != 'ref':
                (q, k), (q_r, k_r) = mlla_features_auto(qk, self.num_heads, rope_table)
                g = values_per_head(g, self.num_heads)
            num, den, const = linear_attention_parts(q, k, q_r, k_r, g, log_decay,
                                                     self.eps, self.normalize,
                                                     self.attn_backend)
        # y = P + N / (r + c), tokens-major, in u's dtype: one pass
        return mlla_output(num, den, self._extra(v, hw), const, u.dtype)

    # ------------------------------------------ mixing-matrix protocol (analysis)
    def mixing_info(self) -> MixerInfo:
        """Kind 'mlla': key 'attention' (per head; causal with the forget gate) and,
        with a per-channel term, 'whole' (per channel); ``d_qk`` = Q/K channels per
        head; the local stencil is LePE's 3x3 kernel (0 without LePE)."""
        per_channel = any(m is not None for m in (self.lepe, self.D, self.delta_proj))
        return MixerInfo('mlla', self.num_heads, self.qk_head_dim,
                         ('attention', 'whole') if per_channel else ('attention', ),
                         grid=True, causal=self.forget_gate is not None,
                         local_kernel=LEPE_KERNEL if self.lepe is not None else 0)

    def _attention_matrix(self, p: Dict[str, Tensor]) -> Tensor:
        args = (p['q'], p['k'], p['q_r'], p['k_r'])
        if p['log_decay'] is not None:
            return gla_mixing_matrix(*args, p['log_decay'], self.eps, self.normalize)
        return mlla_mixing_matrix(*args, self.eps, self.normalize)

    def mixing_matrices(self, u: Tensor,
                        hw: Optional[Grid] = None) -> Dict[str, Tensor]:
        """``'attention'`` (batch, num_heads, N, N) and, with a per-channel term,
        ``'whole'`` (batch, dim, N, N); see the module docstring. ``hw`` is
        required."""
        hw = self._check(u, hw)
        p = self._parts(u, hw)
        A = self._attention_matrix(p)
        out = {'attention': A}
        if 'whole' not in self.mixing_info().keys:
            return out
        M = A.repeat_interleave(self.head_dim, dim=1)
        if p['delta'] is not None:
            M = M * p['delta'].to(M.dtype).transpose(1, 2)[:, :, None, :]
        if self.D is not None:
            M = M + torch.diag_embed(self.D.to(M.dtype)[:, None].expand(
                -1, M.shape[-1]))
        if self.lepe is not None:
            M = M + depthwise_conv_matrix(self.lepe.weight.to(M.dtype), hw)
        out['whole'] = M
        return out

    def mixing_values(self, u: Tensor, hw: Optional[Grid] = None) -> Dict[str, Tensor]:
        """``'attention'``: G per head (batch, num_heads, N, e); ``'whole'``: V per
        channel (batch, dim, N, 1). Plus the LePE bias per channel, ``M X`` is the
        mixer's output (see the module docstring)."""
        p = self._parts(u, hw)
        out = {'attention': p['g']}
        if 'whole' in self.mixing_info().keys:
            out['whole'] = p['v'].to(p['g'].dtype).transpose(1, 2)[..., None]
        return out

    def extra_repr(self) -> str:
        on = [name for name, flag in (
            ('value_proj', self.v is not None), ('rope', self.rope),
            ('lepe', self.lepe is not None), ('input_gate', self.delta_proj is not None),
            (f'forget_gate={self.forget_gate}', self.forget_gate is not None),
            ('shortcut', self.D is not None))
            if flag]
        qk = f', qk_dim={self.qk_dim}' if self.qk_dim != self.dim else ''
        return (f'dim={self.dim}, num_heads={self.num_heads}{qk}, normalize='
                f'{self.normalize}, designs={on}')
