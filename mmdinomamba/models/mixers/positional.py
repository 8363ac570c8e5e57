"""Positional encodings of tokens on a 2-D grid, computed for any grid size.

Tokens are in raster order: token ``n`` of an ``(h, w)`` grid sits at row
``r = n // w`` and column ``s = n % w`` (0-based).

2-D RoPE (MLLA's, over the full width ``C`` of the tokens): the channels form
``C / 2`` interleaved pairs ``(2m, 2m + 1)``; with ``k_max = C / 4`` and
``theta_k = base^(-k / k_max)``, pair ``m < C / 4`` turns by ``r * theta_m`` and
pair ``m >= C / 4`` by ``s * theta_(m - C / 4)``::

    (x_2m, x_2m+1) -> (x_2m cos phi - x_2m+1 sin phi,  x_2m sin phi + x_2m+1 cos phi)

The angles are computed from the grid, in float64, and the rotation runs in real
arithmetic: no table bound to one resolution, no complex dtype. A caller that
rotates many tensors on one grid (every block of an MLLA stage) builds the cos /
sin table once (:func:`rope_2d_table`) and hands it to :func:`rope_2d`; without a
table, :func:`rope_2d` builds its own (the slow twin: the same numbers).

A depthwise ``k x k`` convolution with zero padding (LePE, CPE) mixes tokens
linearly per channel; :func:`depthwise_conv_matrix` writes it as the
``(seqlen, seqlen)`` matrix of each channel (the rank-analysis view).
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from mmdinomamba.ops import float32_or_wider

Tensor = torch.Tensor

__all__ = ['depthwise_conv_matrix', 'grid_conv', 'rope_2d', 'rope_2d_angles',
           'rope_2d_table']

RopeTable = Tuple[Tensor, Tensor]


def _check_grid(hw, seqlen: int, who: str) -> Tuple[int, int]:
    if len(hw) != 2 or int(hw[0]) < 1 or int(hw[1]) < 1:
        raise ValueError(f'{who}: hw must be a grid (height, width) of positive '
                         f'ints, got {hw!r}')
    h, w = int(hw[0]), int(hw[1])
    if h * w != seqlen:
        raise ValueError(f'{who}: {seqlen} tokens do not fill the grid {(h, w)} '
                         f'({h * w} tokens)')
    return h, w


def rope_2d_angles(hw: Tuple[int, int], dim: int, base: float = 10000.0,
                   device=None) -> Tensor:
    """The rotation angle of each channel pair at each token.

    Args:
        hw (tuple): the grid (h, w).
        dim (int): channels C, a multiple of 4.
        base (float): Defaults to 10000.
        device: where to build the angles.

    Returns:
        Tensor: (h * w, C / 2) float64: ``r * theta_m`` for the first C / 4 pairs,
        ``s * theta_(m - C/4)`` for the others.
    """
    if dim % 4:
        raise ValueError(f'rope_2d: the width ({dim}) must be a multiple of 4 '
                         '(pairs of channels, half for rows, half for columns)')
    h, w = hw
    k_max = dim // 4
    theta = base ** (-torch.arange(k_max, dtype=torch.float64, device=device) / k_max)
    rows = torch.arange(h, dtype=torch.float64, device=device).repeat_interleave(w)
    cols = torch.arange(w, dtype=torch.float64, device=device).repeat(h)
    return torch.cat([rows[:, None] * theta, cols[:, None] * theta], dim=1)


def rope_2d_table(hw: Tuple[int, int], dim: int, base: float = 10000.0, device=None,
                  dtype: torch.dtype = torch.float32) -> RopeTable:
    """The cosines and sines of :func:`rope_2d_angles`, for :func:`rope_2d`.

    Args:
        hw (tuple): the grid (h, w).
        dim (int): channels C, a multiple of 4.
        base (float): Defaults to 10000.
        device: where to build the table.
        dtype (torch.dtype): the dtype of the rotation (float32, or float64 for
            float64 input). Defaults to float32.

    Returns:
        tuple: (cos, sin), each (h * w, C / 2) in ``dtype``, computed in float64
        and rounded once.
    """
    angles = rope_2d_angles(tuple(hw), dim, base, device)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rope_2d(x: Tensor, hw: Tuple[int, int], base: float = 10000.0,
            table: Optional[RopeTable] = None) -> Tensor:
    """Rotate the channel pairs of every token by its grid position (2-D RoPE).

    Args:
        x (Tensor): (batch, h * w, ..., C), tokens in raster order, C a multiple
            of 4; every slice ``x[:, :, i, ...]`` is rotated on its own (e.g. Q and
            K stacked as (batch, h * w, 2, C)).
        hw (tuple): the grid (h, w).
        base (float): Defaults to 10000.
        table (tuple, optional): ``rope_2d_table(hw, C, base, dtype=...)`` in the
            rotation's dtype, built once for many calls on one grid; None builds
            it here.

    Returns:
        Tensor: x's shape, in float32, or float64 for float64 input.
    """
    if x.dim() < 3:
        raise ValueError(f'rope_2d: x must have shape (batch, seqlen, ..., dim), got '
                         f'{tuple(x.shape)}')
    hw = _check_grid(hw, x.shape[1], 'rope_2d')
    dtype = float32_or_wider(x.dtype)
    if table is None:
        table = rope_2d_table(hw, x.shape[-1], base, x.device, dtype)
    cos, sin = table
    expected = (x.shape[1], x.shape[-1] // 2)
    if tuple(cos.shape) != expected or tuple(sin.shape) != expected:
        raise ValueError(f'rope_2d: the table must be two {expected} tensors (tokens, '
                         f'channel pairs), got {tuple(cos.shape)} and '
                         f'{tuple(sin.shape)}')
    if cos.dtype != dtype or sin.dtype != dtype:
        raise ValueError(f'rope_2d: the table must be in {dtype} for {x.dtype} input, '
                         f'got {cos.dtype}: build it with rope_2d_table(..., '
                         f'dtype={dtype})')
    # one token axis, then broadcast over the axes between it and the channels
    cos, sin = (t.view(expected[0], *(1, ) * (x.dim() - 3), expected[1])
                for t in (cos, sin))
    pairs = x.to(dtype).unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos],
                       dim=-1).flatten(-2)


def grid_conv(conv: nn.Conv2d, x: Tensor, hw: Tuple[int, int]) -> Tensor:
    """Apply a 2-D convolution to tokens on their grid.

    Args:
        conv (nn.Conv2d): keeps the grid size (e.g. ``k x k``, padding ``k // 2``).
        x (Tensor): (batch, h * w, C) in raster order.
        hw (tuple): the grid (h, w).

    Returns:
        Tensor: (batch, h * w, C_out).
    """
    h, w = _check_grid(hw, x.shape[1], type(conv).__name__)
    grid = x.transpose(1, 2).unflatten(-1, (h, w))
    return conv(grid).flatten(2).transpose(1, 2)


def depthwise_conv_matrix(weight: Tensor, hw: Tuple[int, int]) -> Tensor:
    """The token-mixing matrix of a depthwise ``k x k`` convolution (zero padding
    ``k // 2``, stride 1, no bias), one per channel.

    ``out[:, c] = P[c] @ x[:, c]`` for tokens in raster order, with
    ``P[c][i, j] = weight[c, 0, a, b]`` where token ``j`` sits at offset
    ``(a - k // 2, b - k // 2)`` from token ``i`` (cross-correlation, as
    ``nn.Conv2d``). Row ``i`` has at most ``k * k`` entries, all within
    ``(k // 2) * (w + 1)`` raster positions of the diagonal.

    Args:
        weight (Tensor): (C, 1, k, k), ``nn.Conv2d(C, C, k, groups=C)`` layout, k odd.
        hw (tuple): the grid (h, w).

    Returns:
        Tensor: (C, h * w, h * w) in weight's dtype.
    """
    if weight.dim() != 4 or weight.shape[1] != 1 or weight.shape[2] != weight.shape[3] \
            or weight.shape[2] % 2 == 0:
        raise ValueError(f'depthwise_conv_matrix: weight must be (C, 1, k, k) with k '
                         f'odd, got {tuple(weight.shape)}')
    h, w = hw
    k = weight.shape[-1]
    half = k // 2
    rows = torch.arange(h, device=weight.device).repeat_interleave(w)
    cols = torch.arange(w, device=weight.device).repeat(h)
    P = weight.new_zeros(weight.shape[0], h * w, h * w)
    token = torch.arange(h * w, device=weight.device)
    for a in range(k):
        for b in range(k):
            r, s = rows + a - half, cols + b - half
            inside = (r >= 0) & (r < h) & (s >= 0) & (s < w)
            i = token[inside]
            j = (r * w + s)[inside]
            P[:, i, j] = weight[:, 0, a, b][:, None]
    return P

