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
        L_ij = prod_{t=j+1..i} a_t ,  a_t = exp(-exp(A_log) dt_t),
        dt_t = max(softplus(u_t W_dt + dt_bias), 1e-4)   per head and token
    y_i = sum_j w_ij G_j / (sum_j n_ij + N eps)       (normalize)
    y_i = sum_j w_ij G_j / N                          (normalize=False)
    y  <- y + D (.) V                                 (shortcut)
    y  <- y + DW3_lepe(V)                             (lepe: depthwise 3x3 conv on V)

Without the forget gate the sums run over all tokens and are computed in
O(N d e) by associativity; the normaliser then is MLLA's
``1 / (Q_i . mean_j K_j + eps)``. With the forget gate the attention is causal in
raster order and recurrent (``S_i = a_i S_(i-1) + K_r,i^T G_i``): linear attention
with a scalar forget gate is SSD with ``C = Q``, ``B = K``, computed by
:func:`mmdinomamba.ops.ssd_scan` (one call for the numerator, one for the normaliser).

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
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from mmdinomamba.ops import BACKENDS, check_finite, ssd_decay_mask, ssd_scan
from mmdinomamba.utils.arg_types import check_arg_types
from .positional import (RopeTable, depthwise_conv_matrix, grid_conv, rope_2d,
                         rope_2d_table)
from .protocol import MixerInfo
from .ssd_mixer import _init_dt_bias

Tensor = torch.Tensor

DT_FLOOR = 1e-4  # smallest forget-gate step: the SSD input is divided by it
SSD_CHUNK = 64  # tokens per chunk of the PyTorch scan (changes rounding only)
LEPE_KERNEL = 3


def _compute_dtype(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


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
        forget_gate (bool): a per-head scalar decay per token (causal, computed by
            the SSD scan). Defaults to False.
        shortcut (bool): add ``D (.) V`` with a learnable ``D`` per channel
            (initialised to 1). Defaults to False.
        eps (float): added to the mean normaliser. Defaults to 1e-6.
        ssd_backend (str): backend of :func:`mmdinomamba.ops.ssd_scan` for the forget
            gate. Defaults to 'auto'.
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
                 forget_gate: bool = False,
                 shortcut: bool = False,
                 eps: float = 1e-6,
                 ssd_backend: str = 'auto'):
        check_arg_types(LinearAttentionMixer, locals(), 'LinearAttentionMixer')
        super().__init__()
        qk_dim = dim if qk_dim is None else qk_dim
        if num_heads < 1 or dim % num_heads or qk_dim % num_heads:
            raise ValueError(f'LinearAttentionMixer: num_heads ({num_heads}) must '
                             f'divide dim ({dim}) and qk_dim ({qk_dim})')
        if rope and qk_dim % 4:
            raise ValueError(f'LinearAttentionMixer: rope needs qk_dim ({qk_dim}) to '
                             'be a multiple of 4 (channel pairs for rows and columns)')
        if ssd_backend not in BACKENDS:
            raise ValueError(f'LinearAttentionMixer: unknown ssd_backend '
                             f'{ssd_backend!r}; choose one of {BACKENDS}')
        self.dim = dim
        self.qk_dim = qk_dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads  # value channels per head
        self.qk_head_dim = qk_dim // num_heads
        self.rope = rope
        self.normalize = normalize
        self.eps = eps
        self.ssd_backend = ssd_backend
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
        if forget_gate:
            self.dt_proj = nn.Linear(dim, num_heads, bias=False)
            self.dt_bias = nn.Parameter(_init_dt_bias(num_heads, 1e-3, 0.1, DT_FLOOR))
            A = torch.empty(num_heads).uniform_(1, 16)
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
    def _check(self, u: Tensor, hw) -> None:
        if u.dim() != 3 or u.shape[-1] != self.dim:
            raise ValueError(f'LinearAttentionMixer: input must have shape (batch, '
                             f'H * W, {self.dim}), got {tuple(u.shape)}')
        if len(hw) != 2 or int(hw[0]) * int(hw[1]) != u.shape[1]:
            raise ValueError(f'LinearAttentionMixer: {u.shape[1]} tokens do not fill '
                             f'the grid hw={tuple(hw)}')

    def _heads(self, t: Tensor, dtype: torch.dtype) -> Tensor:
        return rearrange(t.to(dtype), 'b n (h d) -> b h n d', h=self.num_heads)

    def rope_table(self, hw: Tuple[int, int], like: Tensor) -> Optional[RopeTable]:
        """The RoPE cos / sin table of this mixer's width on the grid ``hw``, for
        inputs like ``like`` (its device; float64 for float64, else float32), or
        None without RoPE. Mixers of one width on one grid (the blocks of an MLLA
        stage) share one table: build it once per forward and pass it to each.

        Returns:
            tuple: (cos, sin), each (H * W, qk_dim / 2); or None.
        """
        if not self.rope:
            return None
        return rope_2d_table(hw, self.qk_dim, device=like.device,
                             dtype=_compute_dtype(like))

    def _rotate(self, qk: Tensor, hw,
                table: Optional[RopeTable]) -> Tuple[Tensor, Tensor]:
        """Q_r and K_r (batch, N, qk_dim) from ``[q | k]`` (batch, N, 2 qk_dim).

        With the grid's table, Q and K turn in one rotation; without one, each
        builds its own (the slow twin: the same numbers, two tables per call)."""
        if table is None:
            q, k = qk.chunk(2, dim=-1)
            return rope_2d(q, hw), rope_2d(k, hw)
        return rope_2d(qk.unflatten(-1, (2, self.qk_dim)), hw, table=table).unbind(2)

    def _parts(self, u: Tensor, hw,
               rope_table: Optional[RopeTable] = None) -> Dict[str, Tensor]:
        """Q, K, Q_r, K_r (batch, num_heads, N, d) and G (batch, num_heads, N, e)
        per head, in float32 (float64 for float64 input); V (batch, N, dim) and
        Delta in the input's dtype; the forget gate's step ``dt`` (batch, N,
        num_heads). ``rope_table``: see :meth:`rope_table`."""
        self._check(u, hw)
        dtype = _compute_dtype(u)
        qk = F.elu(self.qk(u)) + 1.0
        q, k = qk.chunk(2, dim=-1)
        v = self.v(u) if self.v is not None else u
        q_r, k_r = self._rotate(qk, hw, rope_table) if self.rope else (q, k)
        delta = F.softplus(self.delta_proj(u)) if self.delta_proj is not None else None
        g = v * delta if delta is not None else v
        parts = dict(q=self._heads(q, dtype), k=self._heads(k, dtype),
                     q_r=self._heads(q_r, dtype), k_r=self._heads(k_r, dtype),
                     g=self._heads(g, dtype), v=v, delta=delta)
        if self.dt_proj is not None:
            dt = F.softplus(self.dt_proj(u).to(dtype) + self.dt_bias.to(dtype))
            parts['dt'] = dt.clamp(min=DT_FLOOR)
        return parts

    def _decay(self, dtype: torch.dtype) -> Tensor:
        return -torch.exp(self.A_log.to(dtype))

    def _attend(self, p: Dict[str, Tensor]) -> Tensor:
        """The attention term ``y`` (batch, N, dim) in the compute dtype."""
        n = p['q'].shape[2]
        if 'dt' in p:
            ssd_args = dict(dt=p['dt'], A=self._decay(p['dt'].dtype),
                            chunk_size=SSD_CHUNK, backend=self.ssd_backend)
            seq = 'b h n d -> b n h d'
            num = ssd_scan(rearrange(p['g'], seq) / p['dt'][..., None],
                           B=rearrange(p['k_r'], seq), C=rearrange(p['q_r'], seq),
                           **ssd_args)
            y = rearrange(num, 'b n h d -> b h n d')
            if self.normalize:
                den = ssd_scan((1.0 / p['dt'])[..., None], B=rearrange(p['k'], seq),
                               C=rearrange(p['q'], seq), **ssd_args)
                y = y / (rearrange(den, 'b n h 1 -> b h n 1') + n * self.eps)
            else:
                y = y / n
        else:
            kv = torch.einsum('bhnd,bhne->bhde', p['k_r'], p['g']) / n
            y = torch.einsum('bhnd,bhde->bhne', p['q_r'], kv)
            if self.normalize:
                den = torch.einsum('bhnd,bhd->bhn', p['q'], p['k'].mean(dim=2))
                y = y / (den[..., None] + self.eps)
        return rearrange(y, 'b h n d -> b n (h d)')

    def forward(self, u: Tensor, hw: Tuple[int, int],
                rope_table: Optional[RopeTable] = None) -> Tensor:
        """Mix tokens.

        Args:
            u (Tensor): (batch, H * W, dim), tokens in raster order.
            hw (tuple): the grid (H, W).
            rope_table (tuple, optional): :meth:`rope_table` of this grid, shared
                by the mixers that run on it; None builds it in this call.

        Returns:
            Tensor: (batch, H * W, dim) in u's dtype.
        """
        check_finite(u, 'LinearAttentionMixer: the input')
        p = self._parts(u, hw, rope_table)
        # sums over all tokens: in float32 even under autocast
        with torch.autocast(u.device.type, enabled=False):
            y = self._attend(p)
            if self.D is not None:
                y = y + p['v'].to(y.dtype) * self.D.to(y.dtype)
        if self.lepe is not None:
            y = y + grid_conv(self.lepe, p['v'], hw).to(y.dtype)
        return y.to(u.dtype)

    # ------------------------------------------ mixing-matrix protocol (analysis)
    def mixing_info(self) -> MixerInfo:
        """Kind 'mlla': key 'attention' (per head; causal with the forget gate) and,
        with a per-channel term, 'whole' (per channel); ``d_qk`` = Q/K channels per
        head; the local stencil is LePE's 3x3 kernel (0 without LePE)."""
        per_channel = any(m is not None for m in (self.lepe, self.D, self.delta_proj))
        return MixerInfo('mlla', self.num_heads, self.qk_head_dim,
                         ('attention', 'whole') if per_channel else ('attention', ),
                         grid=True, causal=self.dt_proj is not None,
                         local_kernel=LEPE_KERNEL if self.lepe is not None else 0)

    def _attention_matrix(self, p: Dict[str, Tensor]) -> Tensor:
        n = p['q'].shape[2]
        w = torch.einsum('bhid,bhjd->bhij', p['q_r'], p['k_r'])
        norm = torch.einsum('bhid,bhjd->bhij', p['q'], p['k'])
        if 'dt' in p:
            L = ssd_decay_mask(p['dt'], self._decay(p['dt'].dtype))
            w, norm = w * L, norm * L
        if not self.normalize:
            return w / n
        return w / (norm.sum(dim=-1, keepdim=True) + n * self.eps)

    def mixing_matrices(self, u: Tensor, hw: Tuple[int, int]) -> Dict[str, Tensor]:
        """``'attention'`` (batch, num_heads, N, N) and, with a per-channel term,
        ``'whole'`` (batch, dim, N, N); see the module docstring."""
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

    def mixing_values(self, u: Tensor, hw: Tuple[int, int]) -> Dict[str, Tensor]:
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
            ('forget_gate', self.dt_proj is not None), ('shortcut', self.D is not None))
            if flag]
        qk = f', qk_dim={self.qk_dim}' if self.qk_dim != self.dim else ''
        return (f'dim={self.dim}, num_heads={self.num_heads}{qk}, normalize='
                f'{self.normalize}, designs={on}')
