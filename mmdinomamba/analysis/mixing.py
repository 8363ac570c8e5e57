"""Materialise the token-mixing matrix ``M`` (``Y = M X``) of a backbone layer.

Four kinds of token mixer (see :data:`MIXER_KINDS`); each says what it is
through the mixing-matrix protocol (:class:`~mmdinomamba.models.mixers.TokenMixer`,
mmpretrain's attention through :class:`~.adapters.MMPretrainAttention`):

=========  ======================================  ==========================================
kind       mixer                                   M (batch, nheads, seqlen, seqlen)
=========  ======================================  ==========================================
softmax    mmpretrain ``MultiheadAttention``       ``softmax(Q K^T * s)``, s = its logit scale
linear     :class:`~mmdinomamba.models.mixers.LinearAttention`
                                                   ``norm(phi(Q) phi(K)^T)``, ``phi`` = softmax
                                                   over the head channels
ssd        :class:`~mmdinomamba.models.mixers.SSDMixer`
                                                   ``M_ij = L_ij (C_i . B_j) dt_j + D delta_ij``
mlla       :class:`~mmdinomamba.models.mixers.LinearAttentionMixer`
                                                   'attention', per head:
                                                   ``A_h = D_z Q_r K_r^T / N``;
                                                   'whole', per channel (batch, dim, ...):
                                                   ``A_h diag(Delta_c) + P_c + D_c I``
=========  ======================================  ==========================================

What ``M X`` reproduces, the token-mixing output before gating, normalisation
and the output projection (``X`` from :func:`mixing_values`):

* softmax and linear (key ``'attention'``): ``X`` is the value projection ``V``
  of each head and ``M V`` is that head's slice of the input of ``attn.proj``.
  The softmax logit scale is read from the attention function the module
  actually calls (:meth:`~.adapters.MMPretrainAttention.logit_scale`). In mmpretrain 1.2.0 that is
  ``head_dims ** -0.5`` with the default ``qk_scale=None`` (PyTorch's
  ``scaled_dot_product_attention``), but with any ``qk_scale`` set it is
  ``head_dims ** +0.5``: the module then calls its own Python implementation
  with ``scale=head_dims ** -0.5``, which divides the logits by ``scale``
  (the value of ``qk_scale`` itself is never used).
* ssd, per direction (keys ``'forward'`` and, for the bidirectional mixer,
  ``'backward'``): ``X`` is the direction's own conv1d + SiLU output ``x_d``,
  in sequence order, and ``M_d x_d`` is the SSD output (``D`` skip included)
  that enters that direction's gated RMSNorm. The backward matrix is given in
  sequence order (upper triangular). The SSD math is
  :func:`mmdinomamba.ops.ssd_mixing_matrix`, reached through the mixer's own
  ``mixing_matrices`` and ``mixing_values``.
* ssd ``'combined'`` = ``(M_forward + M_backward) / 2``. Each direction has its
  own gated RMSNorm and its own depthwise conv, and the mixer averages the two
  *normed* outputs, so no single matrix maps one ``X`` to the mixer's output.
  What holds exactly is ``(M_f x_f + M_b x_b) / 2`` = the average of the two
  pre-norm SSD outputs, i.e. ``[M_f / 2, M_b / 2]`` applied to ``[x_f; x_b]``;
  ``'combined'`` is the token mixing of that average when both directions
  read the same values (``x_f = x_b``): what the mixing would be without the
  norms and with one shared conv. It is the "bidirectional attention" view of
  Vim-style models; its blocks below the diagonal come from ``M_f`` alone and
  those above from ``M_b`` alone.
* mlla (MLLA's linear attention on a token grid; ``hw`` needed): 'attention'
  acts on the (gated) values per head, ``A_h G_h`` being the attention term;
  'whole' acts on each channel's values ``V_c`` (batch, dim, seqlen, 1), and
  ``M^(c) V_c`` plus the LePE bias is the mixer's output (before the block's
  gate and output projection). ``P_c`` is the LePE stencil, ``D`` the shortcut,
  ``Delta`` the input gate (see
  :mod:`mmdinomamba.models.mixers.linear_attention_mixer`).
"""
import copy
import dataclasses
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from mmdinomamba.models.mixers import MIXER_KINDS, MixerInfo
from .adapters import (as_backbone, as_mixer, eval_no_grad, is_mixer, normalise_layers,
                       softmax_attention_matrix)

Tensor = torch.Tensor

__all__ = [
    'MIXER_KINDS', 'MixerCall', 'MixerInfo', 'capture_mixer_calls',
    'capture_mixer_inputs', 'find_mixer', 'mixer_info',
    'mixer_kind', 'mixing_matrices', 'mixing_values', 'normalise_layers',
    'num_layers', 'softmax_attention_matrix', 'softmax_logit_scale', 'ssd_decay_masks'
]


def mixer_kind(module: nn.Module):
    """'ssd', 'linear', 'softmax', 'mlla' or None when ``module`` is not a known
    mixer."""
    return as_mixer(module).mixing_info().kind if is_mixer(module) else None


def mixer_info(mixer: nn.Module) -> MixerInfo:
    """Kind, heads, D_QK (or N) and matrix names of a known mixer.

    The names are the mixer's own, plus ``'combined'`` for a mixer with both a
    'forward' and a 'backward' matrix (see the module docstring).
    """
    info = as_mixer(mixer).mixing_info()
    if {'forward', 'backward'} <= set(info.keys):
        return dataclasses.replace(info, keys=info.keys + ('combined', ))
    return info


def num_layers(backbone) -> int:
    """The number of blocks of a supported backbone."""
    return as_backbone(backbone).num_layers


def find_mixer(layer: nn.Module) -> nn.Module:
    """The first known token mixer inside a block."""
    for module in layer.modules():
        if is_mixer(module):
            return module
    raise ValueError(f'no known token mixer inside {type(layer).__name__}')


class MixerCall(NamedTuple):
    """What a token mixer was called with: its input and its token grid.

    Attributes:
        u (Tensor): (batch, seqlen, dim), the mixer's input.
        hw (tuple): the (height, width) grid of the block's tokens (the patch
            grid of a plain backbone, whose sequence may also hold readout
            tokens; the stage's grid of a hierarchical one).
    """
    u: Tensor
    hw: Tuple[int, int]


@torch.no_grad()
def capture_mixer_calls(backbone: nn.Module, images: Tensor,
                        layers: Sequence[int]) -> Dict[int, MixerCall]:
    """The input and the token grid of the token mixer of each requested layer.

    Runs the backbone's ``forward_intermediates`` in eval mode, which stops after
    the last requested block (``out_indices`` play no part).

    Args:
        backbone (nn.Module): a supported backbone (:mod:`.adapters`).
        images (Tensor): (batch, 3, height, width), normalised.
        layers (Sequence[int]): block indices (negative from the end).

    Returns:
        dict: layer index -> :class:`MixerCall` (the normed tokens the mixer
        reads, and their grid).
    """
    api = as_backbone(backbone)
    indices = normalise_layers(layers, api.num_layers)
    with eval_no_grad(api):
        out = api.forward_intermediates(images, indices, mixer_inputs=True)
    missing = [i for i in indices if i not in out.mixer_inputs]
    if missing:
        raise RuntimeError(f'the forward pass never reached the mixers of layers '
                           f'{missing}')
    return {i: MixerCall(out.mixer_inputs[i].detach(), tuple(out.layout_of(i).hw))
            for i in indices}


def capture_mixer_inputs(backbone: nn.Module, images: Tensor,
                         layers: Sequence[int]) -> Dict[int, Tensor]:
    """The input of the token mixer of each requested layer
    (:func:`capture_mixer_calls` without the grids).

    Returns:
        dict: layer index -> (batch, seqlen, dim).
    """
    return {i: call.u for i, call in capture_mixer_calls(backbone, images,
                                                         layers).items()}


def _in_dtype(mixer: nn.Module, u: Tensor, dtype: torch.dtype):
    """A copy of ``mixer`` and ``u`` in ``dtype`` (the mixer itself if it matches)."""
    if u.dim() != 3:
        raise ValueError(f'mixer input must have shape (batch, seqlen, dim), got '
                         f'{tuple(u.shape)}')
    if not torch.isfinite(u).all():
        raise ValueError('mixer input contains NaN or Inf values')
    if any(p.dtype != dtype for p in mixer.parameters()):
        mixer = copy.deepcopy(mixer).to(dtype)
    return as_mixer(mixer), u.to(dtype)


def softmax_logit_scale(attn: nn.Module) -> float:
    """The factor mmpretrain's ``MultiheadAttention`` multiplies ``q k^T`` by
    (:meth:`~.adapters.MMPretrainAttention.logit_scale`)."""
    return as_mixer(attn).logit_scale()


@torch.no_grad()
def mixing_matrices(mixer: nn.Module, u: Tensor,
                    dtype: torch.dtype = torch.float64,
                    hw: Optional[Tuple[int, int]] = None) -> Dict[str, Tensor]:
    """The token-mixing matrices of one mixer on its input ``u``.

    Args:
        mixer (nn.Module): a known mixer (SSDMixer, LinearAttention,
            LinearAttentionMixer, mmpretrain MultiheadAttention).
        u (Tensor): (batch, seqlen, dim), the mixer's input.
        dtype (torch.dtype): compute dtype (mixer and input are cast to it).
            Defaults to float64.
        hw (tuple, optional): the token grid, needed by grid mixers
            (``mixer_info(mixer).grid``), ignored by the others.

    Returns:
        dict: key -> (batch, nheads, seqlen, seqlen) (per channel for
        'whole': (batch, dim, seqlen, seqlen)); keys are
        ``mixer_info(mixer).keys`` (see the module docstring for their meaning).
    """
    info = mixer_info(mixer)
    mixer, u = _in_dtype(mixer, u, dtype)
    mats = dict(mixer.mixing_matrices(u, hw))
    if 'combined' in info.keys:
        mats['combined'] = (mats['forward'] + mats['backward']) / 2
    return mats


@torch.no_grad()
def mixing_values(mixer: nn.Module, u: Tensor,
                  dtype: torch.dtype = torch.float64,
                  hw: Optional[Tuple[int, int]] = None) -> Dict[str, Tensor]:
    """The ``X`` that each matrix acts on (not defined for 'combined').

    Args:
        mixer (nn.Module): a known mixer.
        u (Tensor): (batch, seqlen, dim).
        dtype (torch.dtype): Defaults to float64.
        hw (tuple, optional): the token grid of a grid mixer.

    Returns:
        dict: key -> (batch, nheads, seqlen, headdim): the value projection
        ('attention'), the direction's conv output ``x_d`` in sequence order
        ('forward', 'backward'), or each channel's values (batch, dim, seqlen, 1)
        ('whole').
    """
    mixer, u = _in_dtype(mixer, u, dtype)
    return dict(mixer.mixing_values(u, hw))


@torch.no_grad()
def ssd_decay_masks(mixer: nn.Module, u: Tensor,
                    dtype: torch.dtype = torch.float64) -> Dict[str, Tensor]:
    """The learnable mask ``L`` of each SSD direction, in sequence order.

    Args:
        mixer (nn.Module): an SSD mixer (one with ``decay_masks``).
        u (Tensor): (batch, seqlen, dim).
        dtype (torch.dtype): Defaults to float64.

    Returns:
        dict: 'forward' (and 'backward', upper triangular) ->
        (batch, nheads, seqlen, seqlen), from :func:`mmdinomamba.ops.ssd_decay_mask`.
    """
    if mixer_kind(mixer) != 'ssd' or not hasattr(mixer, 'decay_masks'):
        raise ValueError('ssd_decay_masks needs an SSD mixer (kind ssd, with '
                         f'decay_masks), got {type(mixer).__name__}')
    mixer, u = _in_dtype(mixer, u, dtype)
    return dict(mixer.decay_masks(u))
