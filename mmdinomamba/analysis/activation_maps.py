"""Activation maps: how much each patch token looks like the readout token.

For one layer of a plain backbone, let r be the readout token (the [CLS] token, or
the mean of the register tokens: the ``cls_token`` output of our backbones) and
p_j the patch token j of the h x w patch grid, both with D channels. Two maps:

``method='cosine'`` (any backbone). The D channels are cut into H consecutive
groups of D / H channels, one per head of the layer's token mixer (``nheads`` of
the SSD mixer, ``num_heads`` of attention); x^g is group g of x::

    map_g[j] = <r^g, p_j^g> / (|r^g| |p_j^g|)

``num_heads=1`` gives the cosine over all channels.

``method='attention'`` (any backbone). The readout token's row of each head's
token-mixing matrix M (``Y = M X``, :mod:`mmdinomamba.analysis.mixing`) at the
patch tokens: how much the readout reads from each patch::

    map_g[j] = M_g[readout, patch_j]

For attention mixers (mmpretrain's softmax ``MultiheadAttention`` and our
``LinearAttention``) this is DINO's attention map. M is computed by
:func:`mmdinomamba.analysis.mixing.mixing_matrices` from the block's normed input
with the module's own qkv projection and logit scale; for softmax attention
M_g = softmax(Q_g K_g^T * s) with s = head_dims ** -0.5 in mmpretrain's default.
Each full row of M sums to 1, so the patch entries sum to 1 minus the weight on
the prefix tokens. For the SSD mixer M is the bidirectional ``'combined'``
matrix (the forward one for a unidirectional mixer), M_ij = L_ij (C_i . B_j) dt_j
averaged over the two directions: the "hidden attention" of a Mamba block. Its
entries are signed and its rows do not sum to 1; the map keeps them as they are.
Several readout tokens average their rows. MLLA has no readout token: its readout
is the mean of all tokens (the pooled feature), so its attention map is the mean
row of each head's attention part ``A_h`` (how much the average token reads from
each patch), and each block's maps are on its own stage's grid.

In both cases the mean map is the average of the head maps::

    mean[j] = (1 / H) sum_g map_g[j]

Maps are upsampled bilinearly (``align_corners=False``) from the patch grid to
the image size. Interpolation is linear, so the mean of the upsampled head maps
is the upsampled mean.

Tokens, their layout and the mixer inputs come from the backbone's
``forward_intermediates`` (:mod:`mmdinomamba.analysis.adapters`). Which token
features a layer gives (``feature_source``) follows the backbone: for DinoVim and
LinearViT it is their ``feature_source`` argument; mmpretrain's
``VisionTransformer`` gets the same two meanings, 'residual' (block output, the
final LayerNorm on the last block if ``final_norm``: what the backbone returns)
and 'normed' (the final LayerNorm on every block).
"""
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmdinomamba.models.backbones import TokenLayout
from .adapters import as_backbone, as_mixer, eval_no_grad, normalise_layers
from .mixing import mixer_info, mixing_matrices

Tensor = torch.Tensor

METHODS = ('cosine', 'attention')
ATTENTION_KINDS = ('softmax', 'linear', 'mlla')

__all__ = [
    'ATTENTION_KINDS', 'METHODS', 'ActivationMaps', 'activation_maps', 'attention_rows',
    'cosine_similarity_maps', 'feature_sources', 'intermediate_attention_rows',
    'layer_activation_maps',
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


def _api(backbone):
    try:
        return as_backbone(backbone)
    except ValueError as err:
        raise ValueError(f'activation maps: {err}') from None


def _check_images(images: Tensor) -> None:
    if not isinstance(images, Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images)
        raise ValueError(f'images must be a (batch, channels, height, width) tensor, '
                         f'got {shape}')
    if not torch.isfinite(images).all():
        raise ValueError('images contain NaN or Inf values')


def feature_sources(backbone: nn.Module) -> Tuple[str, ...]:
    """The ``feature_source`` values a backbone accepts."""
    return tuple(_api(backbone).feature_sources)


def token_layout(backbone: nn.Module, images: Tensor) -> TokenLayout:
    """Where the readout and patch tokens of ``images`` sit in the token sequence.

    Args:
        backbone (nn.Module): DinoVim, LinearViT or mmpretrain VisionTransformer.
        images (Tensor): (batch, channels, height, width).

    Returns:
        TokenLayout: readout positions, patch positions (raster order), grid (h, w).
    """
    api = _api(backbone)
    with eval_no_grad(api):
        return api.forward_intermediates(images[:1], [0]).layout


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
    out = _layer_intermediates(_api(backbone), images, layers, feature_source)
    return out.features, out.layout


def _layer_intermediates(api, images: Tensor, layers: Sequence[int],
                         feature_source: Optional[str] = None):
    """:func:`layer_tokens` as the backbone's ``Intermediates`` (with the layout of
    each block: those of a hierarchical backbone's stages differ)."""
    _check_images(images)
    indices = normalise_layers(layers, api.num_layers)
    if feature_source is not None and feature_source not in api.feature_sources:
        raise ValueError(f'{type(api).__name__}: unknown feature_source '
                         f'{feature_source!r}; choose one of {api.feature_sources}')
    with eval_no_grad(api):
        return api.forward_intermediates(images, indices, feature_source)


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


def _num_heads(api, index: int, dim: int, num_heads: Optional[int]) -> int:
    if num_heads is not None:
        return num_heads
    heads = as_mixer(api.token_mixer(index)).mixing_info().nheads
    if dim % heads:
        raise ValueError(f'layer {index}: its mixer has {heads} heads, which do not '
                         f'divide the {dim} channels; pass num_heads')
    return heads


def _row_key(mixer: nn.Module) -> str:
    """The matrix of ``mixing_matrices`` whose readout row is the attention map."""
    info = mixer_info(mixer)
    if info.kind in ATTENTION_KINDS:
        return 'attention'
    return 'combined' if 'combined' in info.keys else 'forward'


def attention_rows(api, images: Tensor, indices: Sequence[int]) -> Dict[int, Tensor]:
    """The readout row of each head's mixing matrix at the patch tokens (the
    ``method='attention'`` maps on the patch grid; eval mode, no gradients).

    Args:
        api: the backbone API (:func:`~.adapters.as_backbone`).
        images (Tensor): (batch, channels, height, width), normalised.
        indices (Sequence[int]): non-negative block indices.

    Returns:
        dict: block index -> (batch, heads, h, w).
    """
    with eval_no_grad(api):
        out = api.forward_intermediates(images, indices, mixer_inputs=True)
    return intermediate_attention_rows(api, out, indices)


def intermediate_attention_rows(api, out, indices: Sequence[int]) -> Dict[int, Tensor]:
    """:func:`attention_rows` from a forward pass already run: ``out`` is the
    ``forward_intermediates(..., mixer_inputs=True)`` result holding ``indices``."""
    rows = {}
    for i in indices:
        layout = out.layout_of(i)
        u = out.mixer_inputs[i]
        mixer = api.token_mixer(i)
        matrix = mixing_matrices(mixer, u, torch.promote_types(u.dtype, torch.float32),
                                 layout.hw)
        row = matrix[_row_key(mixer)][:, :, layout.readout].mean(dim=2)
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
    api = _api(backbone)
    _check_images(images)
    depth = api.num_layers
    indices = normalise_layers(range(depth) if layers is None else layers, depth)
    if method == 'attention':
        if num_heads is not None or feature_source is not None:
            raise ValueError("method='attention' reads the mixer's own heads and "
                             'input: num_heads and feature_source must be None')
        grids = attention_rows(api, images, indices)
    else:
        out = _layer_intermediates(api, images, indices, feature_source)
        grids = {}
        for i, t in out.features.items():
            layout = out.layout_of(i)
            readout = t[:, layout.readout].mean(dim=1)
            heads = _num_heads(api, i, t.shape[-1], num_heads)
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

