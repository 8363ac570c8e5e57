"""What the backbones share.

:class:`Backbone` is every backbone's contract: the arch presets
(``_parse_arch``), the checked ``Pretrained`` load, and the per-layer analysis
API (``forward_intermediates`` with its mixer-input capture, ``token_mixer``).
MLLA (hierarchical) builds on it directly.

A plain backbone (:class:`PlainBackbone`) embeds patches, lays out a token
sequence (patches plus readout tokens such as [CLS] or registers), runs
``depth`` blocks and formats outputs. Subclasses say where the readout and patch
tokens sit (:class:`TokenLayout`) and what a block is; this base class owns the
output contract, position-embedding resizing, freezing and layer-wise
learning-rate decay.
"""
import contextlib
import math
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.registry import DefaultScope

from mmdinomamba.models.checkpoint import load_pretrained, pretrained_cfg, read_state_dict

from mmdinomamba.ops import check_finite
from mmdinomamba.utils.arg_types import check_like

Tensor = torch.Tensor

OUT_TYPES = ('cls_token', 'featmap', 'avg_featmap', 'raw')
DENSE_SCOPES = ('mmseg', 'mmdet')  # default scopes whose models need feature maps


READOUT_TYPES = ('cls', 'registers', 'mean')


@dataclass
class TokenLayout:
    """Where tokens sit in a sequence of ``seqlen`` tokens.

    Positions that are neither readout nor patches are other prefix tokens (e.g.
    DinoVim's first [CLS] copy at 0, whose readout is the middle copy).

    Attributes:
        readout (Tensor): (n_readout,) long, positions of the readout tokens
            ([CLS] or registers); the ``cls_token`` output is their mean.
        patches (Tensor): (h * w,) long, positions of the patch tokens in raster
            order: ``tokens[:, patches].reshape(batch, h, w, dim)`` is the grid.
        hw (tuple): the patch grid (h, w).
        readout_type (str): 'cls' (one [CLS] token), 'registers' (the mean of
            register tokens) or 'mean' (no readout token: the mean of all patch
            tokens, a pooled backbone's feature). Defaults to 'cls'.
    """
    readout: Tensor
    patches: Tensor
    hw: Tuple[int, int]
    readout_type: str = 'cls'


class Intermediates(NamedTuple):
    """What :meth:`PlainBackbone.forward_intermediates` returns.

    Attributes:
        features (dict): block index (non-negative, ascending) -> (batch, seqlen,
            dim), the token sequence after that block (see ``feature_source``).
        layout (TokenLayout): where the readout and patch tokens sit in it.
        mixer_inputs (dict): block index -> (batch, seqlen, dim), the input of
            that block's token mixer (its normed stream); empty unless asked for.
        layouts (dict, optional): block index -> :class:`TokenLayout`, for a
            backbone whose blocks work on grids of different sizes (stages of a
            hierarchical backbone); None when every block has ``layout``.
            Read it through :meth:`layout_of`.
    """
    features: Dict[int, Tensor]
    layout: TokenLayout
    mixer_inputs: Dict[int, Tensor]
    layouts: Optional[Dict[int, TokenLayout]] = None

    def layout_of(self, index: int) -> TokenLayout:
        """The layout of block ``index``'s tokens (and of its mixer's input)."""
        return self.layout if self.layouts is None else self.layouts[index]


def resize_pos_embed(pos_embed: Tensor, src_hw: Tuple[int, int],
                     dst_hw: Tuple[int, int], num_prefix: int = 0) -> Tensor:
    """Resize a grid position embedding bicubically, keeping prefix slots as they are.

    Follows the DINO convention of the official models: ``F.interpolate`` with
    ``scale_factor = (dst + 0.1) / src`` per axis (the 0.1 guards the floor of the
    output size against rounding), no antialiasing, ``align_corners=False``.
    Matching it exactly matters: a size-based resize samples slightly different
    points.

    Args:
        pos_embed (Tensor): (1, num_prefix + src_h * src_w, dim).
        src_hw (tuple): grid the table was made for.
        dst_hw (tuple): grid wanted.
        num_prefix (int): leading slots that are not on the grid ([CLS]).

    Returns:
        Tensor: (1, num_prefix + dst_h * dst_w, dim).
    """
    # under torch.jit.trace (mmengine's complexity counter, mmdet's get_flops) a
    # grid read from a tensor's shape is a tensor: the trace keeps it as a constant
    src_hw, dst_hw = (tuple(int(v) if torch.is_tensor(v) else v for v in hw)
                      for hw in (src_hw, dst_hw))
    if tuple(src_hw) == tuple(dst_hw):
        return pos_embed
    if pos_embed.shape[1] != num_prefix + src_hw[0] * src_hw[1]:
        raise ValueError(f'resize_pos_embed: table of {pos_embed.shape[1]} slots '
                         f'does not fit {num_prefix} prefix slots + grid {src_hw}')
    prefix, grid = pos_embed[:, :num_prefix], pos_embed[:, num_prefix:]
    dim = grid.shape[-1]
    grid = grid.reshape(1, *src_hw, dim).permute(0, 3, 1, 2)
    scale = ((dst_hw[0] + 0.1) / src_hw[0], (dst_hw[1] + 0.1) / src_hw[1])
    grid = F.interpolate(grid.float(), scale_factor=scale, mode='bicubic',
                         align_corners=False).to(pos_embed.dtype)
    if tuple(grid.shape[-2:]) != tuple(dst_hw):
        raise RuntimeError(f'resize_pos_embed: got grid {tuple(grid.shape[-2:])}, '
                           f'wanted {tuple(dst_hw)}')
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, dim)
    return torch.cat([prefix, grid], dim=1)


class PatchEmbed(nn.Module):
    """Non-overlapping patches: (batch, 3, H, W) -> (batch, h * w, dim), (h, w).

    The strided convolution ``proj`` (its name matches the official checkpoints)
    is applied as what it is, one matrix product of the flattened patches with
    the flattened kernel. On an H200 (bf16, 768 channels, batch 4 x 1024 px or
    128 x 224 px) that takes 0.2 ms forward and 0.8 ms forward + backward, where
    cuDNN's convolution, which has no tensor-core kernel for 3 input channels,
    took 1.1 and 2.4 to 3.0 ms. Pixels past the last whole patch are dropped, as
    by the convolution.
    """

    def __init__(self, in_channels: int, dim: int, patch_size: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        if x.dim() != 4 or x.shape[1] != self.proj.in_channels:
            raise ValueError(f'PatchEmbed: input must have shape (batch, '
                             f'{self.proj.in_channels}, H, W), got {tuple(x.shape)}')
        if x.shape[-2] < self.patch_size or x.shape[-1] < self.patch_size:
            raise ValueError(f'PatchEmbed: input {tuple(x.shape[-2:])} is smaller '
                             f'than one patch ({self.patch_size})')
        check_finite(x, 'PatchEmbed: the batch of input images')
        p = self.patch_size
        batch, chans = x.shape[:2]
        h, w = x.shape[-2] // p, x.shape[-1] // p
        patches = x[..., :h * p, :w * p].reshape(batch, chans, h, p, w, p)
        patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(batch, h * w, chans * p * p)
        return F.linear(patches, self.proj.weight.flatten(1), self.proj.bias), (h, w)


def _normalise_indices(indices: Union[int, Sequence[int]], depth: int) -> List[int]:
    indices = [indices] if isinstance(indices, int) else list(indices)
    out = []
    for i in indices:
        j = i + depth if i < 0 else i
        if not 0 <= j < depth:
            raise ValueError(f'out_indices: {i} is out of range for depth {depth}')
        out.append(j)
    return out


def _check_dense_out_type(backbone: nn.Module) -> None:
    """First forward inside an mmseg / mmdet run: a vector ``out_type`` is a mistake.

    Segmentation and detection necks and heads index feature maps; (batch, dim)
    outputs fail deep inside them (``IndexError: tuple index out of range``).
    """
    scope = DefaultScope.get_current_instance()
    if scope is not None and scope.scope_name in DENSE_SCOPES \
            and backbone.out_type in ('cls_token', 'avg_featmap'):
        raise ValueError(
            f'{type(backbone).__name__}: out_type={backbone.out_type!r} gives (batch, '
            f'dim) vectors, but this is an {scope.scope_name} model, whose necks and '
            f"heads need feature maps: set out_type='featmap' and out_indices (one "
            f'map per index, e.g. [5, 11, 17, 23] for 24 blocks); see '
            f'docs/dense_prediction.md')


def mean_readout_layout(hw: Tuple[int, int], device=None) -> TokenLayout:
    """The layout of a sequence that is all patches (raster order), whose readout
    is their mean (``readout_type='mean'``: MLLA, PlainMLLA)."""
    every = torch.arange(hw[0] * hw[1], device=device)
    return TokenLayout(readout=every, patches=every, hw=tuple(hw), readout_type='mean')


class Backbone(BaseModule):
    """Every backbone's contract: arch presets, the checked ``Pretrained`` load and
    the per-layer analysis API.

    Subclasses set ``arch_zoo`` (preset name -> arch dict), ``essential_keys``
    (what a custom arch must give) and ``feature_sources``, and implement
    :meth:`token_mixer` and ``forward_intermediates`` (with
    :meth:`_intermediate_indices` and :meth:`_mixer_input_capture`).
    """
    arch_zoo: Dict[str, dict] = {}
    essential_keys: Tuple[str, ...] = ()
    feature_sources: Tuple[str, ...] = ('residual', )

    # ----------------------------------------------------------------- arch
    @classmethod
    def _parse_arch(cls, arch: Union[str, dict]) -> dict:
        """A preset's (by name, case-insensitive) or a custom arch dict, checked:
        the essential keys present, the presets' value types, and
        :meth:`_check_arch`'s rules."""
        if isinstance(arch, str):
            key = arch.lower()
            if key not in cls.arch_zoo:
                raise ValueError(f'{cls.__name__}: unknown arch {arch!r}; choose one '
                                 f'of {sorted(cls.arch_zoo)} or pass a dict')
            return dict(cls.arch_zoo[key])
        if not isinstance(arch, dict):
            raise ValueError(f'{cls.__name__}: arch must be a str or dict, got {arch!r}')
        missing = sorted(set(cls.essential_keys) - set(arch))
        if missing:
            raise ValueError(f'{cls.__name__}: custom arch is missing {missing} '
                             f'(needs {list(cls.essential_keys)})')
        # the preset's types: embed_dims an int, depths a list of ints, ...
        check_like(arch, next(iter(cls.arch_zoo.values())), f'{cls.__name__}: arch.')
        cls._check_arch(arch)
        return dict(arch)

    @classmethod
    def _check_arch(cls, arch: dict) -> None:
        """A subclass's own rules for a custom arch (raise ValueError)."""

    # ------------------------------------------------------------- initialisation
    def init_weights(self):
        """mmengine's initialisation, with a checked ``Pretrained`` load.

        ``init_cfg=dict(type='Pretrained', checkpoint=..., prefix=None,
        map_location='cpu', strict=True)`` loads through
        :func:`mmdinomamba.models.checkpoint.load_pretrained` (the file read by
        :meth:`read_checkpoint_state`), after the other ``init_cfg`` entries:
        every missing and unexpected key is reported, and a checkpoint that does
        not cover the backbone fails unless ``strict=False``. Without ``prefix``
        the backbone's keys are found as the module docstring there says (a
        DINO checkpoint's teacher first).
        """
        pretrained = pretrained_cfg(self.init_cfg)
        if pretrained is None or self._is_init:
            super().init_weights()
            return
        cfgs = self.init_cfg if isinstance(self.init_cfg, (list, tuple)) else []
        saved = self.init_cfg
        self.init_cfg = [c for c in cfgs if c is not pretrained] or None
        try:
            super().init_weights()  # the other init_cfg entries first
        finally:
            self.init_cfg = saved
        load_pretrained(self, pretrained, self.read_checkpoint_state)
        self._is_init = True

    def read_checkpoint_state(self, path: str, map_location='cpu') -> Dict[str, Tensor]:
        """The state dict of the checkpoint file ``path`` (for the ``Pretrained``
        load): :func:`mmdinomamba.models.checkpoint.read_state_dict`; a backbone
        that converts foreign layouts reads and converts here."""
        return read_state_dict(path, map_location)

    # ------------------------------------------------------ per-layer analysis API
    def token_mixer(self, index: int) -> nn.Module:
        """The token mixer of block ``index`` (it follows
        :class:`mmdinomamba.models.mixers.TokenMixer`)."""
        raise NotImplementedError(f'{type(self).__name__} does not say where its '
                                  'token mixers are: implement token_mixer(index)')

    def _intermediate_indices(self, indices: Optional[Union[int, Sequence[int]]],
                              feature_source: Optional[str]) -> List[int]:
        """``forward_intermediates``'s arguments checked: the block indices
        (None = all, negative from the end), sorted and unique."""
        if feature_source is not None and feature_source not in self.feature_sources:
            raise ValueError(f'{type(self).__name__}: unknown feature_source '
                             f'{feature_source!r}; choose one of {self.feature_sources}')
        all_blocks = range(self.num_layers)
        indices = sorted(set(_normalise_indices(all_blocks if indices is None
                                                else indices, self.num_layers)))
        if not indices:
            raise ValueError(f'{type(self).__name__}.forward_intermediates: no '
                             'block indices given')
        return indices

    @contextlib.contextmanager
    def _mixer_input_capture(self, indices: Sequence[int], enabled: bool = True):
        """While open, the input of each listed block's token mixer is stored in
        the dict it yields (block index -> (batch, seqlen, dim)); nothing when
        not ``enabled``."""
        captured: Dict[int, Tensor] = {}
        handles = []
        if enabled:
            for i in indices:
                handles.append(self.token_mixer(i).register_forward_pre_hook(
                    lambda module, args, i=i: captured.__setitem__(i, args[0])))
        try:
            yield captured
        finally:
            for handle in handles:
                handle.remove()

    # ------------------------------------------------------- training utilities
    def _freeze_stages(self):
        """Freeze what ``frozen_stages`` names (each backbone says what that is)."""

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        return self


class PlainBackbone(Backbone):
    """Base class: output formatting, position embeddings, freezing, lr decay.

    Subclasses set ``arch_zoo``/``essential_keys``/``feature_sources``, build
    ``patch_embed``, ``pos_embed`` and ``layers`` and implement :meth:`embed`
    (images -> tokens and their :class:`TokenLayout`),
    ``forward_tokens(tokens, indices, feature_source=None, hw=None)`` (the blocks;
    ``hw`` is the layout's patch grid, passed on every call, for blocks that need
    it) and :meth:`token_mixer`. No state is kept between these calls.

    Analysis reads a backbone through :meth:`forward_intermediates` (per-block
    tokens, their :class:`TokenLayout`, the mixers' inputs) and
    :meth:`token_mixer` (a :class:`~mmdinomamba.models.mixers.TokenMixer`);
    ``init_cfg=dict(type='Pretrained', ..., strict=True)`` loads a checkpoint
    with every key checked (:meth:`init_weights`).

    Output types (``out_type``), for each index in ``out_indices``:

    - ``'cls_token'``: (batch, dim), the readout token (mean of readouts);
    - ``'featmap'``: (batch, dim, h, w), patch tokens on their grid;
    - ``'avg_featmap'``: (batch, dim), mean of the patch tokens;
    - ``'raw'``: (batch, seqlen, dim), the whole sequence.
    """
    num_pos_prefix: int = 0  # pos_embed slots before the grid ([CLS])
    feature_sources: Tuple[str, ...] = ('residual', 'normed')  # forward_tokens's

    def __init__(self, arch, img_size: Union[int, Tuple[int, int]], patch_size: int,
                 out_indices, out_type: str, final_norm: bool, frozen_stages: int,
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        self.arch_settings = self._parse_arch(arch)
        self.embed_dims = self.arch_settings['embed_dims']
        self.num_layers = self.arch_settings['num_layers']
        if out_type not in OUT_TYPES:
            raise ValueError(f'{type(self).__name__}: unknown out_type {out_type!r}; '
                             f'choose one of {OUT_TYPES}')
        self.out_type = out_type
        self.out_indices = _normalise_indices(out_indices, self.num_layers)
        self.final_norm = final_norm
        self.frozen_stages = frozen_stages
        self.patch_size = patch_size
        img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if min(img_size) < patch_size:
            raise ValueError(f'{type(self).__name__}: img_size {img_size} is smaller than '
                             f'patch_size {patch_size}: the position embedding needs '
                             f'at least one patch per side')
        self.patch_resolution = (img_size[0] // patch_size, img_size[1] // patch_size)
        self._register_load_state_dict_pre_hook(self._prepare_pos_embed)
        self._consumer_checked = False

    # ---------------------------------------------------------------- embedding
    def pos_embed_for(self, hw: Tuple[int, int]) -> Tensor:
        """The position table for grid ``hw`` (resized from ``patch_resolution``)."""
        return resize_pos_embed(self.pos_embed, self.patch_resolution, hw,
                                self.num_pos_prefix)

    def _prepare_pos_embed(self, state_dict, prefix, *args, **kwargs):
        """Load hook: resize a checkpoint's ``pos_embed`` made for another grid."""
        name = prefix + 'pos_embed'
        if name not in state_dict:
            return
        ckpt = state_dict[name]
        if ckpt.shape == self.pos_embed.shape:
            return
        n_grid = ckpt.shape[1] - self.num_pos_prefix
        side = int(math.isqrt(n_grid))
        if side * side != n_grid:
            raise ValueError(f'{type(self).__name__}: cannot resize checkpoint '
                             f'pos_embed {tuple(ckpt.shape)}: grid is not square')
        state_dict[name] = resize_pos_embed(ckpt, (side, side), self.patch_resolution,
                                            self.num_pos_prefix)
        print_log(f'Resized pos_embed from {tuple(ckpt.shape)} to '
                  f'{tuple(state_dict[name].shape)}', logger='current')

    # ------------------------------------------------------------------ outputs
    def format_output(self, tokens: Tensor, layout: TokenLayout) -> Tensor:
        """Turn a (batch, seqlen, dim) sequence into the ``out_type`` output."""
        if self.out_type == 'raw':
            return tokens
        if self.out_type == 'cls_token':
            return tokens[:, layout.readout].mean(dim=1)
        patches = tokens[:, layout.patches]
        if self.out_type == 'avg_featmap':
            return patches.mean(dim=1)
        batch, _, dim = patches.shape
        return patches.transpose(1, 2).reshape(batch, dim, *layout.hw)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """Args: x (Tensor): (batch, 3, H, W). Returns: one output per ``out_indices``."""
        if not self._consumer_checked and not torch.compiler.is_compiling():
            _check_dense_out_type(self)  # reads mmengine's scope: not while compiling
            self._consumer_checked = True
        tokens, layout = self.embed(x)
        feats = self.forward_tokens(tokens, self.out_indices, hw=layout.hw)
        return tuple(self.format_output(f, layout) for f in feats)

    # ------------------------------------------------------ per-layer analysis API
    def forward_intermediates(self,
                              x: Tensor,
                              indices: Optional[Union[int, Sequence[int]]] = None,
                              feature_source: Optional[str] = None,
                              mixer_inputs: bool = False) -> Intermediates:
        """Per-block token sequences, their layout and (optionally) mixer inputs.

        The one per-layer API for analysis (activation maps, mixing matrices), in
        the spirit of timm's ``forward_intermediates``. Runs the blocks up to the
        last requested one and stops there; ``out_indices``/``out_type`` play no
        part. Mode and gradients are the caller's (analysis runs it in eval mode
        under ``torch.no_grad()``).

        Args:
            x (Tensor): (batch, channels, height, width) images.
            indices (int | Sequence[int], optional): block indices, negative from
                the end; an int is one block. None = every block.
            feature_source (str, optional): one of ``feature_sources`` (what a
                block's output is, see the class docstring); None = the
                backbone's own ``feature_source``.
            mixer_inputs (bool): also return the input of each requested block's
                token mixer. Defaults to False.

        Returns:
            Intermediates: ``features`` {block: (batch, seqlen, dim)}, ``layout``
            (:class:`TokenLayout` for the image's patch grid) and
            ``mixer_inputs`` {block: (batch, seqlen, dim)} (empty if not asked).
        """
        indices = self._intermediate_indices(indices, feature_source)
        tokens, layout = self.embed(x)
        with self._mixer_input_capture(indices, mixer_inputs) as captured:
            feats = self.forward_tokens(tokens, indices, feature_source, layout.hw)
        return Intermediates(dict(zip(indices, feats)), layout, captured)

    # ------------------------------------------------------- training utilities
    def _freeze_stages(self):
        """Freeze the embeddings and the first ``frozen_stages`` layers."""
        if self.frozen_stages <= 0:
            return
        frozen = [self.patch_embed] + list(self.layers[:self.frozen_stages])
        if self.frozen_stages >= self.num_layers:
            frozen += [m for m in self.final_norm_modules()]
        for module in frozen:
            module.eval()
            for p in module.parameters():
                p.requires_grad = False
        for name in self.embedding_param_names():
            getattr(self, name).requires_grad = False

    def final_norm_modules(self) -> List[nn.Module]:
        return []

    def embedding_param_names(self) -> List[str]:
        return ['pos_embed']

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """Layer id of a parameter for layer-wise learning-rate decay.

        Embeddings are layer 0, block ``i`` is layer ``i + 1`` and everything
        after the blocks is layer ``num_layers + 1``.

        Args:
            param_name (str): parameter name, e.g. ``'backbone.layers.3.norm.weight'``.
            prefix (str): prefix stripped first (e.g. ``'backbone.'``).

        Returns:
            tuple: (layer id, number of layers), ids in ``[0, num_layers + 1]``.
        """
        num_layers = self.num_layers + 2
        if not param_name.startswith(prefix):
            return num_layers - 1, num_layers
        name = param_name[len(prefix):]
        if name.startswith(('patch_embed', 'pos_embed', 'cls_token', 'pos_embed_cls')):
            return 0, num_layers
        if name.startswith('layers.'):
            return int(name.split('.')[1]) + 1, num_layers
        return num_layers - 1, num_layers

    def no_weight_decay(self) -> List[str]:
        """Parameter names (suffixes) that should get no weight decay."""
        return ['pos_embed', 'cls_token', 'pos_embed_cls']
