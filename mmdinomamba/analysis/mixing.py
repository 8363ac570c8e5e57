"""Materialise the token-mixing matrix ``M`` (``Y = M X``) of a backbone layer.

Three kinds of token mixer, recognised by class (see :data:`MIXER_KINDS`):

=========  ======================================  ==========================================
kind       mixer                                   M, per head (batch, nheads, seqlen, seqlen)
=========  ======================================  ==========================================
softmax    mmpretrain ``MultiheadAttention``       ``softmax(Q K^T * s)``, s = its logit scale
linear     :class:`~mmdinomamba.models.mixers.LinearAttention`
                                                   ``norm(phi(Q) phi(K)^T)``, ``phi`` = softmax
                                                   over the head channels
ssd        :class:`~mmdinomamba.models.mixers.SSDMixer`
                                                   ``M_ij = L_ij (C_i . B_j) dt_j + D delta_ij``
=========  ======================================  ==========================================

What ``M X`` reproduces, the token-mixing output before gating, normalisation
and the output projection (``X`` from :func:`mixing_values`):

* softmax and linear (key ``'attention'``): ``X`` is the value projection ``V``
  of each head and ``M V`` is that head's slice of the input of ``attn.proj``.
  The softmax logit scale is read from the attention function the module
  actually calls (:func:`softmax_logit_scale`). In mmpretrain 1.2.0 that is
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
  ``mixing_matrices``.
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
"""
import copy
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch
import torch.nn as nn
from einops import rearrange

from mmdinomamba.models.mixers import LinearAttention, SSDMixer
from mmdinomamba.ops import ssd_decay_mask

Tensor = torch.Tensor

MIXER_KINDS = ('softmax', 'linear', 'ssd')


def _mmpretrain_attention():
    """mmpretrain's ``MultiheadAttention`` class, or None when mmpretrain is absent."""
    try:
        from mmpretrain.models.utils.attention import MultiheadAttention
    except ImportError:
        return None
    return MultiheadAttention


def mixer_kind(module: nn.Module) -> Optional[str]:
    """'ssd', 'linear', 'softmax' or None when ``module`` is not a known mixer."""
    if isinstance(module, SSDMixer):
        return 'ssd'
    if isinstance(module, LinearAttention):
        return 'linear'
    mha = _mmpretrain_attention()
    if mha is not None and isinstance(module, mha):
        return 'softmax'
    return None


@dataclass(frozen=True)
class MixerInfo:
    """What the rank bounds need to know about a mixer.

    Attributes:
        kind (str): one of :data:`MIXER_KINDS`.
        nheads (int): heads (matrices per key).
        d_qk (int): query/key channels per head (softmax, linear); for ssd the
            state size N (the width of C and B).
        keys (tuple): names of the matrices :func:`mixing_matrices` returns.
    """
    kind: str
    nheads: int
    d_qk: int
    keys: tuple


def mixer_info(mixer: nn.Module) -> MixerInfo:
    """Kind, heads, D_QK (or N) and matrix names of a known mixer."""
    kind = mixer_kind(mixer)
    if kind == 'ssd':
        keys = (('forward', 'backward', 'combined') if mixer.bidirectional else
                ('forward', ))
        return MixerInfo(kind, mixer.nheads, mixer.d_state, keys)
    if kind == 'linear':
        return MixerInfo(kind, mixer.num_heads, mixer.dim // mixer.num_heads,
                         ('attention', ))
    if kind == 'softmax':
        return MixerInfo(kind, mixer.num_heads, mixer.head_dims, ('attention', ))
    raise ValueError(f'{type(mixer).__name__} is not a known token mixer; known: '
                     'SSDMixer, LinearAttention, mmpretrain MultiheadAttention')


def backbone_layers(backbone: nn.Module) -> nn.ModuleList:
    """The block list (``backbone.layers``) of DinoVim, LinearViT or mmpretrain ViT."""
    layers = getattr(backbone, 'layers', None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f'{type(backbone).__name__} has no `layers` ModuleList; '
                         'supported: DinoVim, LinearViT, mmpretrain VisionTransformer')
    return layers


def find_mixer(layer: nn.Module) -> nn.Module:
    """The first known token mixer inside a block."""
    for module in layer.modules():
        if mixer_kind(module) is not None:
            return module
    raise ValueError(f'no known token mixer inside {type(layer).__name__}')


def normalise_layers(layers: Sequence[int], depth: int) -> list:
    """Layer indices (negative from the end) -> sorted unique indices in [0, depth)."""
    out = set()
    for i in layers:
        j = i + depth if i < 0 else i
        if not 0 <= j < depth:
            raise ValueError(f'layer {i} is out of range for depth {depth}')
        out.add(j)
    if not out:
        raise ValueError('no layers given')
    return sorted(out)


class _Captured(Exception):
    """Raised by the last capture hook to stop the forward pass early."""


@torch.no_grad()
def capture_mixer_inputs(backbone: nn.Module, images: Tensor,
                         layers: Sequence[int]) -> Dict[int, Tensor]:
    """The input of the token mixer of each requested layer.

    Runs the backbone in eval mode with forward pre-hooks on the mixers and stops
    after the last requested one. Our plain backbones run ``embed`` and
    ``forward_tokens`` (so their ``out_indices`` do not cut the pass short);
    others (mmpretrain's ViT) run ``backbone(images)``.

    Args:
        backbone (nn.Module): DinoVim, LinearViT or mmpretrain VisionTransformer.
        images (Tensor): (batch, 3, height, width), normalised.
        layers (Sequence[int]): block indices (negative from the end).

    Returns:
        dict: layer index -> (batch, seqlen, dim), the normed tokens the mixer
        reads (the mixer's own input).
    """
    blocks = backbone_layers(backbone)
    indices = normalise_layers(layers, len(blocks))
    captured: Dict[int, Tensor] = {}
    last = indices[-1]

    def hook_for(index):
        def hook(module, args):
            captured[index] = args[0].detach()
            if index == last:
                raise _Captured
        return hook

    handles = [find_mixer(blocks[i]).register_forward_pre_hook(hook_for(i))
               for i in indices]
    was_training = backbone.training
    backbone.eval()
    try:
        if hasattr(backbone, 'embed') and hasattr(backbone, 'forward_tokens'):
            backbone.forward_tokens(backbone.embed(images)[0], [last])
        else:
            backbone(images)
    except _Captured:
        pass
    finally:
        for handle in handles:
            handle.remove()
        backbone.train(was_training)
    missing = [i for i in indices if i not in captured]
    if missing:
        raise RuntimeError(f'the forward pass never reached the mixers of layers '
                           f'{missing}')
    return captured


def _in_dtype(mixer: nn.Module, u: Tensor, dtype: torch.dtype):
    """A copy of ``mixer`` and ``u`` in ``dtype`` (the mixer itself if it matches)."""
    if u.dim() != 3:
        raise ValueError(f'mixer input must have shape (batch, seqlen, dim), got '
                         f'{tuple(u.shape)}')
    if not torch.isfinite(u).all():
        raise ValueError('mixer input contains NaN or Inf values')
    if any(p.dtype != dtype for p in mixer.parameters()):
        mixer = copy.deepcopy(mixer).to(dtype)
    return mixer, u.to(dtype)


def _softmax_qkv(attn: nn.Module, u: Tensor):
    """q, k, v of mmpretrain's MultiheadAttention, each (batch, nheads, seqlen,
    head_dims)."""
    qkv = attn.qkv(u)
    return rearrange(qkv, 'b l (three h d) -> three b h l d', three=3,
                     h=attn.num_heads).unbind(0)


def softmax_logit_scale(attn: nn.Module) -> float:
    """The factor mmpretrain's ``MultiheadAttention`` multiplies ``q k^T`` by.

    Read from ``attn.scaled_dot_product_attention``, the function its forward
    calls: PyTorch's ``scaled_dot_product_attention`` multiplies by its
    ``scale`` (default ``head_dims ** -0.5``); mmpretrain's
    ``scaled_dot_product_attention_pyimpl`` divides by its ``scale`` (default
    ``head_dims ** 0.5``). Either may come wrapped in ``functools.partial``.
    """
    import functools

    import torch.nn.functional as F
    fn = getattr(attn, 'scaled_dot_product_attention', None)
    scale = None
    if isinstance(fn, functools.partial):
        fn, scale = fn.func, fn.keywords.get('scale')
    if fn is F.scaled_dot_product_attention:
        return attn.head_dims ** -0.5 if scale is None else scale
    if getattr(fn, '__name__', '') == 'scaled_dot_product_attention_pyimpl':
        return 1.0 / (attn.head_dims ** 0.5 if scale is None else scale)
    raise ValueError(f'{type(attn).__name__}: unknown attention function {fn!r}; '
                     'cannot tell its logit scale')


def softmax_attention_matrix(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``softmax(q k^T * scale)`` over the keys.

    Args:
        q, k (Tensor): (batch, nheads, seqlen, head_dims).
        scale (float): the logit scale.

    Returns:
        Tensor: (batch, nheads, seqlen, seqlen), rows summing to 1.
    """
    return (torch.einsum('bhld,bhsd->bhls', q, k) * scale).softmax(dim=-1)


@torch.no_grad()
def mixing_matrices(mixer: nn.Module, u: Tensor,
                    dtype: torch.dtype = torch.float64) -> Dict[str, Tensor]:
    """The token-mixing matrices of one mixer on its input ``u``.

    Args:
        mixer (nn.Module): SSDMixer, LinearAttention or mmpretrain MultiheadAttention.
        u (Tensor): (batch, seqlen, dim), the mixer's input.
        dtype (torch.dtype): compute dtype (mixer and input are cast to it).
            Defaults to float64.

    Returns:
        dict: key -> (batch, nheads, seqlen, seqlen); keys are
        ``mixer_info(mixer).keys`` (see the module docstring for their meaning).
    """
    info = mixer_info(mixer)
    mixer, u = _in_dtype(mixer, u, dtype)
    if info.kind == 'softmax':
        q, k, _ = _softmax_qkv(mixer, u)
        return {'attention': softmax_attention_matrix(q, k, softmax_logit_scale(mixer))}
    mats = dict(mixer.mixing_matrices(u))
    if info.kind == 'ssd' and mixer.bidirectional:
        mats['combined'] = (mats['forward'] + mats['backward']) / 2
    return mats


@torch.no_grad()
def mixing_values(mixer: nn.Module, u: Tensor,
                  dtype: torch.dtype = torch.float64) -> Dict[str, Tensor]:
    """The ``X`` that each per-head matrix acts on (not defined for 'combined').

    Args:
        mixer (nn.Module): a known mixer.
        u (Tensor): (batch, seqlen, dim).
        dtype (torch.dtype): Defaults to float64.

    Returns:
        dict: key -> (batch, nheads, seqlen, headdim): the value projection
        ('attention') or the direction's conv output ``x_d`` in sequence order
        ('forward', 'backward').
    """
    info = mixer_info(mixer)
    mixer, u = _in_dtype(mixer, u, dtype)
    if info.kind == 'softmax':
        return {'attention': _softmax_qkv(mixer, u)[2]}
    if info.kind == 'linear':
        return {'attention': mixer._qkv(u)[2]}
    zxbcdt = mixer.in_proj(u)
    out = {}
    for direction in mixer.directions:
        flip = direction == 'backward'
        x = mixer.ssd_inputs(zxbcdt.flip(1) if flip else zxbcdt, direction)['x']
        out[direction] = rearrange(x.flip(1) if flip else x, 'b l h p -> b h l p')
    return out


@torch.no_grad()
def ssd_decay_masks(mixer: SSDMixer, u: Tensor,
                    dtype: torch.dtype = torch.float64) -> Dict[str, Tensor]:
    """The learnable mask ``L`` of each SSD direction, in sequence order.

    Args:
        mixer (SSDMixer): the mixer.
        u (Tensor): (batch, seqlen, dim).
        dtype (torch.dtype): Defaults to float64.

    Returns:
        dict: 'forward' (and 'backward', upper triangular) ->
        (batch, nheads, seqlen, seqlen), from :func:`mmdinomamba.ops.ssd_decay_mask`.
    """
    if mixer_kind(mixer) != 'ssd':
        raise ValueError('ssd_decay_masks needs an SSDMixer, got '
                         f'{type(mixer).__name__}')
    mixer, u = _in_dtype(mixer, u, dtype)
    zxbcdt = mixer.in_proj(u)
    out = {}
    for direction in mixer.directions:
        flip = direction == 'backward'
        a = mixer.ssd_inputs(zxbcdt.flip(1) if flip else zxbcdt, direction)
        L = ssd_decay_mask(a['dt'], a['A'], a['dt_bias'], dt_softplus=True)
        out[direction] = L.flip(-1).flip(-2) if flip else L
    return out
