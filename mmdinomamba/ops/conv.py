"""Depthwise causal 1-D convolution over the token axis (Mamba's short conv)."""
from typing import Optional

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def causal_depthwise_conv1d(x: Tensor, weight: Tensor,
                            bias: Optional[Tensor] = None) -> Tensor:
    """``out_t = bias + sum_{i < k} weight[:, k - 1 - i] * x_{t - i}`` (zeros before t=0).

    Equal to ``nn.Conv1d(ch, ch, k, groups=ch, padding=k - 1)`` on the
    channel-first input, cut to the first ``seqlen`` outputs, but computed as
    ``k`` shifted multiply-adds in the channel-last layout: no transposes, and
    fast on the CPU in any dtype (PyTorch's grouped conv falls back to a slow
    per-group loop in float64).

    Args:
        x (Tensor): (batch, seqlen, channels).
        weight (Tensor): (channels, 1, k) or (channels, k), ``nn.Conv1d`` layout.
        bias (Tensor, optional): (channels,).

    Returns:
        Tensor: (batch, seqlen, channels).
    """
    weight = weight.reshape(weight.shape[0], -1)
    if x.dim() != 3 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f'causal_depthwise_conv1d: x must have shape (batch, '
                         f'seqlen, {weight.shape[0]}), got {tuple(x.shape)}')
    k = weight.shape[1]
    windows = F.pad(x, (0, 0, k - 1, 0)).unfold(1, k, 1)  # (batch, seqlen, ch, k)
    out = torch.einsum('blck,ck->blc', windows, weight.to(x.dtype))
    return out if bias is None else out + bias.to(x.dtype)
