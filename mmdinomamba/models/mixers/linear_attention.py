"""Multi-head linear attention (the token mixer of LinearViT)."""
from typing import Dict, Optional

import torch
import torch.nn as nn
from einops import rearrange

from mmdinomamba.ops import check_finite
from mmdinomamba.ops.linear_attention import linear_attention, linear_attention_matrix
from .protocol import Grid, MixerInfo

Tensor = torch.Tensor


class LinearAttention(nn.Module):
    """``(batch, seqlen, dim) -> (batch, seqlen, dim)``: qkv, linear attention, proj.

    Args:
        dim (int): model width.
        num_heads (int): heads; must divide ``dim``.
        qkv_bias (bool): Defaults to True.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True):
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f'LinearAttention: num_heads ({num_heads}) must divide '
                             f'dim ({dim})')
        self.dim = dim
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def _qkv(self, u: Tensor):
        if u.dim() != 3 or u.shape[-1] != self.dim:
            raise ValueError(f'LinearAttention: input must have shape (batch, '
                             f'seqlen, {self.dim}), got {tuple(u.shape)}')
        return rearrange(self.qkv(u), 'b l (three h d) -> three b h l d', three=3,
                         h=self.num_heads).unbind(0)

    def forward(self, u: Tensor, hw: Optional[Grid] = None) -> Tensor:
        """(batch, seqlen, dim) -> same; ``hw`` is ignored (no grid needed)."""
        check_finite(u, 'LinearAttention: the input')
        q, k, v = self._qkv(u)
        y = linear_attention(q, k, v)
        return self.proj(rearrange(y, 'b h l d -> b l (h d)'))

    # ------------------------------------------ mixing-matrix protocol (analysis)
    def mixing_info(self) -> MixerInfo:
        """Kind 'linear', ``num_heads`` heads of ``dim // num_heads`` channels."""
        return MixerInfo('linear', self.num_heads, self.dim // self.num_heads,
                         ('attention', ))

    def mixing_matrices(self, u: Tensor, hw: Optional[Grid] = None) -> Dict[str, Tensor]:
        """``{'attention': M}`` with ``M`` (batch, nheads, seqlen, seqlen); the
        mixer's pre-projection output per head is ``M v``."""
        q, k, _ = self._qkv(u)
        return {'attention': linear_attention_matrix(q, k)}

    def mixing_values(self, u: Tensor, hw: Optional[Grid] = None) -> Dict[str, Tensor]:
        """``{'attention': v}``, the value projection (batch, nheads, seqlen,
        headdim): ``M v`` is each head's slice of the input of ``proj``."""
        return {'attention': self._qkv(u)[2]}
