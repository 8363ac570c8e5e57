"""Activation maps: how much each patch token looks like the readout token.

For one layer of a plain backbone, let r be the readout token (the [CLS] token, or
the mean of the register tokens: the ``cls_token`` output of our backbones) and
p_j the patch token j of the h x w patch grid, both with D channels. Two maps:

``method='cosine'`` (any backbone). The D channels are cut into H consecutive
groups of D / H channels, one per head of the layer's token mixer (``nheads`` of
the SSD mixer, ``num_heads`` of attention); x^g is group g of x::

    map_g[j] = <r^g, p_j^g> / (|r^g| |p_j^g|)

``num_heads=1`` gives the cosine over all channels.

``method='attention'`` (attention mixers: mmpretrain's softmax
``MultiheadAttention`` and our ``LinearAttention``). DINO's attention map: the
readout query's row of each head's mixing matrix M, at the patch keys::

    map_g[j] = M_g[readout, patch_j]

M is computed by :func:`mmdinomamba.analysis.mixing.mixing_matrices` from the
block's normed input with the module's own qkv projection and logit scale; for
softmax attention M_g = softmax(Q_g K_g^T * s) with s = head_dims ** -0.5 in
mmpretrain's default. Each full row of M sums to 1, so the patch entries sum to
1 minus the weight on the prefix tokens. Several readout tokens average their rows.

In both cases the mean map is the average of the head maps::

    mean[j] = (1 / H) sum_g map_g[j]

Maps are upsampled bilinearly (``align_corners=False``) from the patch grid to
the image size. Interpolation is linear, so the mean of the upsampled head maps
is the upsampled mean.

Which token features a layer gives (``feature_source``) follows the backbone: for
DinoVim and LinearViT it is their ``forward_tokens`` argument; mmpretrain's
``VisionTransformer`` gets the same two meanings, 'residual' (block output, the
final LayerNorm on the last block if ``final_norm``: what the backbone returns)
and 'normed' (the final LayerNorm on every block).
"""
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmdinomamba.models.backbones import DinoVim, LinearViT
from mmdinomamba.models.backbones.base import PlainBackbone, TokenLayout
from mmdinomamba.models.backbones.dino_vim import FEATURE_SOURCES as VIM_SOURCES
from mmdinomamba.models.backbones.linear_vit import \
    FEATURE_SOURCES as LINEAR_VIT_SOURCES
from .mixing import (backbone_layers, capture_mixer_inputs, find_mixer, mixer_info,
                     mixer_kind, mixing_matrices, normalise_layers)

Tensor = torch.Tensor

METHODS = ('cosine', 'attention')
ATTENTION_KINDS = ('softmax', 'linear')
VIT_SOURCES = ('residual', 'normed')

__all__ = [
    'ATTENTION_KINDS', 'METHODS', 'ActivationMaps', 'activation_maps',
    'cosine_similarity_maps', 'feature_sources', 'layer_activation_maps',
    'layer_tokens', 'token_layout', 'upsample_maps'
]


class ActivationMaps(NamedTuple):
    """Activation maps of one layer.

    Attributes:
        heads (Tensor): (batch, heads, height, width), one map per head.
        mean (Tensor): (batch, height, width), the average over heads.
    """
    heads: Tensor
    mean: Tensor


def _mmpretrain_vit():
    """mmpretrain's ``VisionTransformer`` class, or None when it is absent."""
    try:
        from mmpretrain.models.backbones import VisionTransformer
    except ImportError:
        return None
    return VisionTransformer


def _is_vit(backbone: nn.Module) -> bool:
    vit = _mmpretrain_vit()
    return vit is not None and isinstance(backbone, vit)


def _check_backbone(backbone: nn.Module) -> None:
    if not isinstance(backbone, PlainBackbone) and not _is_vit(backbone):
        raise ValueError(f'activation maps support DinoVim, LinearViT and '
                         f'mmpretrain VisionTransformer, got {type(backbone).__name__}')


def _check_images(images: Tensor) -> None:
    if not isinstance(images, Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images)
        raise ValueError(f'images must be a (batch, channels, height, width) tensor, '
                         f'got {shape}')
    if not torch.isfinite(images).all():
        raise ValueError('images contain NaN or Inf values')


def feature_sources(backbone: nn.Module) -> Tuple[str, ...]:
    """The ``feature_source`` values a backbone accepts."""
    if isinstance(backbone, DinoVim):
        return VIM_SOURCES
    if isinstance(backbone, LinearViT):
        return LINEAR_VIT_SOURCES
    if _is_vit(backbone):
        return VIT_SOURCES
    _check_backbone(backbone)
    return ('residual', 'normed')


def token_layout(backbone: nn.Module, images: Tensor) -> TokenLayout:
    """Where the readout and patch tokens of ``images`` sit in the token sequence.

    Args:
        backbone (nn.Module): DinoVim, LinearViT or mmpretrain VisionTransformer.
        images (Tensor): (batch, channels, height, width).

    Returns:
        TokenLayout: readout positions, patch positions (raster order), grid (h, w).
    """
    _check_backbone(backbone)
    with torch.no_grad():
        _, hw = backbone.patch_embed(images[:1])
    hw = (int(hw[0]), int(hw[1]))
    if isinstance(backbone, PlainBackbone):
        return backbone.token_layout(hw, images.device)
    if backbone.cls_token is None:
        raise ValueError('this VisionTransformer has no [CLS] token '
                         '(with_cls_token=False): it has no readout token')
    first = backbone.num_extra_tokens
    return TokenLayout(readout=torch.tensor([0], device=images.device),
                       patches=torch.arange(first, first + hw[0] * hw[1],
                                            device=images.device), hw=hw)


class _Stop(Exception):
    """Raised by the hook of the last requested layer to end the forward pass."""


def _vit_tokens(vit: nn.Module, images: Tensor, indices: Sequence[int],
                source: str) -> Dict[int, Tensor]:
    """Block outputs of mmpretrain's ViT, through forward hooks on its layers."""
    if source == 'normed' and not vit.final_norm:
        raise ValueError("feature_source='normed' needs the final LayerNorm, but "
                         'this VisionTransformer has final_norm=False')
    captured: Dict[int, Tensor] = {}
    last = max(indices)

    def hook_for(index):
        def hook(module, args, output):
            captured[index] = output
            if index == last:
                raise _Stop
        return hook

    handles = [vit.layers[i].register_forward_hook(hook_for(i)) for i in indices]
    try:
        vit(images)
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    depth = len(vit.layers)
    return {i: vit.ln1(t) if source == 'normed' or (i == depth - 1 and vit.final_norm)
            else t for i, t in captured.items()}


def layer_tokens(backbone: nn.Module, images: Tensor, layers: Sequence[int],
                 feature_source: Optional[str] = None
                 ) -> Tuple[Dict[int, Tensor], TokenLayout]:
    """The token sequence after each requested block, and its layout.

    Runs in eval mode without gradients and stops after the last requested block.

    Args:
        backbone (nn.Module): DinoVim, LinearViT or mmpretrain VisionTransformer.
        images (Tensor): (batch, channels, height, width), normalised.
        layers (Sequence[int]): block indices, negative from the end.
        feature_source (str, optional): see the module docstring; None uses the
            backbone's own (``'residual'`` for mmpretrain's ViT).

    Returns:
        tuple: dict block index (non-negative) -> (batch, seqlen, dim), and the
        :class:`TokenLayout`.
    """
    _check_backbone(backbone)
    _check_images(images)
    indices = normalise_layers(layers, len(backbone_layers(backbone)))
    sources = feature_sources(backbone)
    if feature_source is not None and feature_source not in sources:
        raise ValueError(f'{type(backbone).__name__}: unknown feature_source '
                         f'{feature_source!r}; choose one of {sources}')
    was_training = backbone.training
    backbone.eval()
    try:
        with torch.no_grad():
            if isinstance(backbone, PlainBackbone):
                tokens, layout = backbone.embed(images)
                feats = backbone.forward_tokens(tokens, indices, feature_source)
                return dict(zip(indices, feats)), layout
            layout = token_layout(backbone, images)
            return _vit_tokens(backbone, images, indices,
                               feature_source or 'residual'), layout
    finally:
        backbone.train(was_training)


def cosine_similarity_maps(readout: Tensor, patches: Tensor, hw: Tuple[int, int],
                           num_heads: int = 1) -> Tensor:
    """Per-head cosine similarity between a readout token and every patch token.

    Args:
        readout (Tensor): (batch, dim).
        patches (Tensor): (batch, h * w, dim), raster order.
        hw (tuple): the patch grid (h, w).
        num_heads (int): H, the number of channel groups; must divide dim.

    Returns:
        Tensor: (batch, heads, h, w) float32 (float64 for float64 input), in [-1, 1].
    """
    if readout.dim() != 2 or patches.dim() != 3 or \
            readout.shape[0] != patches.shape[0] or readout.shape[1] != patches.shape[2]:
        raise ValueError(f'readout must be (batch, dim) and patches (batch, h * w, '
                         f'dim), got {tuple(readout.shape)} and {tuple(patches.shape)}')
    batch, num, dim = patches.shape
    if num != hw[0] * hw[1]:
        raise ValueError(f'{num} patch tokens do not fill the grid {tuple(hw)}')
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or \
            num_heads < 1 or dim % num_heads:
        raise ValueError(f'num_heads must be a positive int dividing dim {dim}, '
                         f'got {num_heads!r}')
    dtype = torch.promote_types(readout.dtype, torch.float32)
    r = F.normalize(readout.to(dtype).reshape(batch, num_heads, dim // num_heads),
                    dim=-1)
    p = F.normalize(patches.to(dtype).reshape(batch, num, num_heads,
                                              dim // num_heads), dim=-1)
    return torch.einsum('bgc,bngc->bgn', r, p).reshape(batch, num_heads, *hw)


def upsample_maps(maps: Tensor, size: Tuple[int, int]) -> Tensor:
    """Bilinear resize of (batch, heads, h, w) maps to (batch, heads, *size)."""
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    return F.interpolate(maps, size=tuple(size), mode='bilinear', align_corners=False)


def _num_heads(backbone: nn.Module, index: int, dim: int,
               num_heads: Optional[int]) -> int:
    if num_heads is not None:
        return num_heads
    heads = mixer_info(find_mixer(backbone_layers(backbone)[index])).nheads
    if dim % heads:
        raise ValueError(f'layer {index}: its mixer has {heads} heads, which do not '
                         f'divide the {dim} channels; pass num_heads')
    return heads


def _attention_rows(backbone: nn.Module, images: Tensor,
                    indices: Sequence[int]) -> Dict[int, Tensor]:
    """The readout row of each head's attention matrix at the patch keys.

    Returns:
        dict: block index -> (batch, heads, h, w).
    """
    blocks = backbone_layers(backbone)
    for i in indices:
        kind = mixer_kind(find_mixer(blocks[i]))
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"method='attention' needs an attention mixer "
                             f'({ATTENTION_KINDS}); layer {i} of '
                             f"{type(backbone).__name__} mixes with '{kind}': use "
                             "method='cosine'")
    layout = token_layout(backbone, images)
    inputs = capture_mixer_inputs(backbone, images, indices)
    rows = {}
    for i in indices:
        u = inputs[i]
        matrix = mixing_matrices(find_mixer(blocks[i]), u,
                                 dtype=torch.promote_types(u.dtype, torch.float32))
        row = matrix['attention'][:, :, layout.readout].mean(dim=2)
        rows[i] = row[..., layout.patches].reshape(*row.shape[:2], *layout.hw)
    return rows


def layer_activation_maps(backbone: nn.Module,
                          images: Tensor,
                          layers: Optional[Sequence[int]] = None,
                          method: str = 'cosine',
                          num_heads: Optional[int] = None,
                          feature_source: Optional[str] = None,
                          upsample: bool = True) -> Dict[int, ActivationMaps]:
    """Activation maps of several layers from one forward pass.

    Args:
        backbone (nn.Module): DinoVim (with or without registers), LinearViT or
            mmpretrain VisionTransformer.
        images (Tensor): (batch, channels, height, width), normalised.
        layers (Sequence[int], optional): block indices, negative from the end;
            None = every block.
        method (str): 'cosine' or 'attention' (see the module docstring).
        num_heads (int, optional): channel groups of the cosine map; None = the
            heads of each layer's mixer. Not used by 'attention' (its heads are
            the mixer's), where it must stay None.
        feature_source (str, optional): token features of the cosine map; None =
            the backbone's own. Must stay None for 'attention'.
        upsample (bool): resize the maps to the image size (True) or keep the
            patch grid (False).

    Returns:
        dict: block index (non-negative, sorted) -> :class:`ActivationMaps`.
    """
    if method not in METHODS:
        raise ValueError(f'unknown method {method!r}; choose one of {METHODS}')
    _check_backbone(backbone)
    _check_images(images)
    depth = len(backbone_layers(backbone))
    indices = normalise_layers(range(depth) if layers is None else layers, depth)
    if method == 'attention':
        if num_heads is not None or feature_source is not None:
            raise ValueError("method='attention' reads the mixer's own heads and "
                             'input: num_heads and feature_source must be None')
        grids = _attention_rows(backbone, images, indices)
    else:
        tokens, layout = layer_tokens(backbone, images, indices, feature_source)
        grids = {}
        for i, t in tokens.items():
            readout = t[:, layout.readout].mean(dim=1)
            heads = _num_heads(backbone, i, t.shape[-1], num_heads)
            grids[i] = cosine_similarity_maps(readout, t[:, layout.patches],
                                              layout.hw, heads)
    out = {}
    for i, grid in grids.items():
        maps = upsample_maps(grid, images.shape[-2:]) if upsample else grid
        out[i] = ActivationMaps(heads=maps, mean=maps.mean(dim=1))
    return out


def activation_maps(backbone: nn.Module,
                    images: Tensor,
                    layer: int = -1,
                    method: str = 'cosine',
                    num_heads: Optional[int] = None,
                    feature_source: Optional[str] = None,
                    upsample: bool = True) -> ActivationMaps:
    """The activation maps of one layer (default the last).

    Args:
        backbone (nn.Module): see :func:`layer_activation_maps`.
        images (Tensor): (batch, channels, height, width), normalised.
        layer (int): block index, negative from the end. Defaults to -1.
        method (str): 'cosine' or 'attention'. Defaults to 'cosine'.
        num_heads (int, optional): see :func:`layer_activation_maps`.
        feature_source (str, optional): see :func:`layer_activation_maps`.
        upsample (bool): resize to the image size. Defaults to True.

    Returns:
        ActivationMaps: ``heads`` (batch, heads, H, W) and ``mean`` (batch, H, W),
        with (H, W) the image size, or the patch grid if not ``upsample``.
    """
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise ValueError(f'layer must be an int, got {layer!r}')
    maps = layer_activation_maps(backbone, images, [layer], method, num_heads,
                                 feature_source, upsample)
    return next(iter(maps.values()))

