"""The model API analysis works on, and adapters that give it to mmpretrain's ViT.

Analysis reads a backbone only through this API (it never checks which of our
classes it has, nor looks inside a block):

- ``num_layers`` (int) and ``feature_sources`` (tuple of str);
- ``forward_intermediates(x, indices, feature_source, mixer_inputs)`` ->
  :class:`~mmdinomamba.models.backbones.Intermediates` (per-block features
  (batch, seqlen, dim), the :class:`~mmdinomamba.models.backbones.TokenLayout`,
  one per block where the blocks' grids differ (``layout_of(index)``), and, if
  asked, each block's mixer input);
- ``token_mixer(index)``: the block's token mixer, which follows the
  mixing-matrix protocol :class:`~mmdinomamba.models.mixers.TokenMixer`.

Our backbones (:class:`~mmdinomamba.models.backbones.PlainBackbone`, and the
hierarchical :class:`~mmdinomamba.models.backbones.MLLA`) have it.
mmpretrain's ``VisionTransformer`` gets it from :class:`MMPretrainViT`, and its
softmax ``MultiheadAttention`` the mixer protocol from :class:`MMPretrainAttention`;
only these adapters know mmpretrain's structure. :func:`as_backbone` and
:func:`as_mixer` pick the adapter when one is needed.
"""
import contextlib
import functools
from typing import Dict, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from mmdinomamba.models.backbones import Intermediates, TokenLayout
from mmdinomamba.models.mixers import MixerInfo, TokenMixer

Tensor = torch.Tensor

SUPPORTED = ('DinoVim, LinearViT, mmpretrain VisionTransformer, or a backbone with '
             'forward_intermediates, token_mixer, num_layers and feature_sources')

__all__ = ['MMPretrainAttention', 'MMPretrainViT', 'as_backbone', 'as_mixer',
           'eval_no_grad', 'is_mixer', 'normalise_layers', 'softmax_attention_matrix']


def _mmpretrain_class(module: str, name: str):
    """A class of mmpretrain, or None when mmpretrain is not installed."""
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except ImportError:
        return None


def _is_mmpretrain(obj, module: str, name: str) -> bool:
    cls = _mmpretrain_class(module, name)
    return cls is not None and isinstance(obj, cls)


def _has_backbone_api(obj) -> bool:
    return all(hasattr(obj, name) for name in ('forward_intermediates', 'token_mixer',
                                               'num_layers', 'feature_sources'))


# --------------------------------------------------------------------------- #
# Mixers
# --------------------------------------------------------------------------- #
def softmax_attention_matrix(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``softmax(q k^T * scale)`` over the keys.

    Args:
        q, k (Tensor): (batch, nheads, seqlen, head_dims).
        scale (float): the logit scale.

    Returns:
        Tensor: (batch, nheads, seqlen, seqlen), rows summing to 1.
    """
    return (torch.einsum('bhld,bhsd->bhls', q, k) * scale).softmax(dim=-1)


class MMPretrainAttention:
    """The mixer protocol for mmpretrain's ``MultiheadAttention`` (softmax).

    ``M = softmax(Q K^T * s)`` per head, ``X`` = the value projection ``V``; ``M V``
    is that head's slice of the input of ``attn.proj``. The logit scale ``s`` is
    read from the attention function the module actually calls
    (:meth:`logit_scale`). In mmpretrain 1.2.0 that is ``head_dims ** -0.5``
    with the default ``qk_scale=None`` (PyTorch's ``scaled_dot_product_attention``),
    but with any ``qk_scale`` set it is ``head_dims ** +0.5``: the module then
    calls its own Python implementation with ``scale=head_dims ** -0.5``, which
    divides the logits by ``scale`` (the value of ``qk_scale`` is never used).

    Args:
        attn (nn.Module): an mmpretrain ``MultiheadAttention``.
    """

    def __init__(self, attn: nn.Module):
        self.module = attn

    def mixing_info(self) -> MixerInfo:
        return MixerInfo('softmax', self.module.num_heads, self.module.head_dims,
                         ('attention', ))

    def _qkv(self, u: Tensor):
        """q, k, v, each (batch, nheads, seqlen, head_dims)."""
        return rearrange(self.module.qkv(u), 'b l (three h d) -> three b h l d',
                         three=3, h=self.module.num_heads).unbind(0)

    def logit_scale(self) -> float:
        """The factor the module multiplies ``q k^T`` by.

        Read from ``attn.scaled_dot_product_attention``, the function its forward
        calls: PyTorch's ``scaled_dot_product_attention`` multiplies by its
        ``scale`` (default ``head_dims ** -0.5``); mmpretrain's
        ``scaled_dot_product_attention_pyimpl`` divides by its ``scale`` (default
        ``head_dims ** 0.5``). Either may come wrapped in ``functools.partial``.
        """
        attn = self.module
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

    def mixing_matrices(self, u: Tensor, hw=None) -> Dict[str, Tensor]:
        """``{'attention': M}``, (batch, nheads, seqlen, seqlen); ``hw`` ignored."""
        q, k, _ = self._qkv(u)
        return {'attention': softmax_attention_matrix(q, k, self.logit_scale())}

    def mixing_values(self, u: Tensor, hw=None) -> Dict[str, Tensor]:
        """``{'attention': V}``, (batch, nheads, seqlen, head_dims); ``hw`` ignored."""
        return {'attention': self._qkv(u)[2]}


def as_mixer(module) -> TokenMixer:
    """``module`` itself if it follows the mixer protocol, else its adapter.

    Raises:
        ValueError: ``module`` is no known token mixer.
    """
    if isinstance(module, MMPretrainAttention) or isinstance(module, TokenMixer):
        return module
    if _is_mmpretrain(module, 'mmpretrain.models.utils.attention', 'MultiheadAttention'):
        return MMPretrainAttention(module)
    raise ValueError(f'{type(module).__name__} is not a known token mixer; known: '
                     'SSDMixer, LinearAttention, mmpretrain MultiheadAttention (or a '
                     'module with mixing_info, mixing_matrices and mixing_values)')


def is_mixer(module) -> bool:
    """Whether :func:`as_mixer` accepts ``module``."""
    try:
        as_mixer(module)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- #
# Backbones
# --------------------------------------------------------------------------- #
class _Stop(Exception):
    """Raised by the hook of the last requested block to end the forward pass."""


class MMPretrainViT:
    """The backbone API for mmpretrain's ``VisionTransformer``.

    Feature sources: 'residual' (block output, the final LayerNorm ``ln1`` on the
    last block if ``final_norm``: what the backbone returns) and 'normed' (``ln1``
    on every block). Layout: [CLS] at 0 is the readout, the patches follow the
    ``num_extra_tokens`` prefix tokens.

    Args:
        vit (nn.Module): an mmpretrain ``VisionTransformer`` (with its [CLS] token).
    """
    feature_sources = ('residual', 'normed')

    def __init__(self, vit: nn.Module):
        self.module = vit
        self.num_layers = len(vit.layers)

    def token_mixer(self, index: int) -> nn.Module:
        """The ``MultiheadAttention`` of block ``index``."""
        return self.module.layers[index].attn

    def token_layout(self, hw, device=None) -> TokenLayout:
        """[CLS] at 0, then the patches after ``num_extra_tokens`` prefix tokens."""
        vit = self.module
        if vit.cls_token is None:
            raise ValueError('this VisionTransformer has no [CLS] token '
                             '(with_cls_token=False): it has no readout token')
        first = vit.num_extra_tokens
        hw = (int(hw[0]), int(hw[1]))
        return TokenLayout(readout=torch.zeros(1, dtype=torch.long, device=device),
                           patches=torch.arange(first, first + hw[0] * hw[1],
                                                device=device), hw=hw)

    def forward_intermediates(self,
                              x: Tensor,
                              indices: Optional[Union[int, Sequence[int]]] = None,
                              feature_source: Optional[str] = None,
                              mixer_inputs: bool = False) -> Intermediates:
        """See :meth:`mmdinomamba.models.backbones.PlainBackbone.forward_intermediates`.

        Runs ``vit(x)`` with hooks and stops after the last requested block.
        """
        vit = self.module
        source = feature_source or 'residual'
        if source not in self.feature_sources:
            raise ValueError(f'VisionTransformer: unknown feature_source {source!r}; '
                             f'choose one of {self.feature_sources}')
        if source == 'normed' and not vit.final_norm:
            raise ValueError("feature_source='normed' needs the final LayerNorm, but "
                             'this VisionTransformer has final_norm=False')
        indices = [indices] if isinstance(indices, int) else indices
        indices = normalise_layers(
            range(self.num_layers) if indices is None else indices, self.num_layers)
        outputs: Dict[int, Tensor] = {}
        inputs: Dict[int, Tensor] = {}
        grid = {}
        last = indices[-1]

        def block_hook(index):
            def hook(module, args, output):
                outputs[index] = output
                if index == last:
                    raise _Stop
            return hook

        def grid_hook(module, args, output):
            grid['hw'] = output[1]  # returns None: the output is kept

        handles = [vit.patch_embed.register_forward_hook(grid_hook)]
        handles += [vit.layers[i].register_forward_hook(block_hook(i))
                    for i in indices]
        if mixer_inputs:
            handles += [self.token_mixer(i).register_forward_pre_hook(
                lambda module, args, i=i: inputs.__setitem__(i, args[0]))
                for i in indices]
        try:
            vit(x)
        except _Stop:
            pass
        finally:
            for handle in handles:
                handle.remove()
        features = {i: vit.ln1(t) if source == 'normed' or
                    (i == self.num_layers - 1 and vit.final_norm) else t
                    for i, t in sorted(outputs.items())}
        return Intermediates(features, self.token_layout(grid['hw'], x.device), inputs)


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


def as_backbone(module):
    """``module`` itself if it has the backbone API, else its adapter.

    Raises:
        ValueError: the module is no supported backbone.
    """
    if isinstance(module, MMPretrainViT) or _has_backbone_api(module):
        return module
    if _is_mmpretrain(module, 'mmpretrain.models.backbones', 'VisionTransformer'):
        return MMPretrainViT(module)
    raise ValueError(f'analysis supports {SUPPORTED}; got {type(module).__name__}')


def _module(backbone) -> nn.Module:
    return backbone.module if isinstance(backbone, MMPretrainViT) else backbone


@contextlib.contextmanager
def eval_no_grad(backbone):
    """Run ``backbone`` (a module or an adapter) in eval mode without gradients,
    then restore its mode."""
    module = _module(backbone)
    was_training = module.training
    module.eval()  # not chained: mmpretrain's ViT.train returns None
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was_training)
