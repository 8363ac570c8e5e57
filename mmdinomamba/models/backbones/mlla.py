"""MLLA: the hierarchical Mamba-Like Linear Attention backbone.

"Demystify Mamba in Vision: A Linear Attention Perspective", Han et al., NeurIPS
2024 (https://arxiv.org/abs/2405.16605; the camera-ready calls it MILA); official
code github LeapLabTHU/MLLA. Module and parameter names follow the official
checkpoints, so their tensors load one-to-one (:mod:`.mlla_official`).

Structure, for tokens ``x`` (batch, H * W, C) in raster order on an (H, W) grid:

- stem (stride 4): ``conv1`` 3x3 s2 (3 -> C/2) + BN + ReLU; ``conv2`` residual pair
  of 3x3 conv + BN (+ ReLU on the first) added to its input; ``conv3`` 3x3 s2
  (C/2 -> 4C) + BN + ReLU, 1x1 (4C -> C) + BN. Inputs whose sides are not
  multiples of 4 are zero-padded at the bottom and right first.
- 4 stages of :class:`MLLABlock` at widths C, 2C, 4C, 8C; between stages
  :class:`PatchMerging` (1x1 conv to 8C + ReLU, 3x3 depthwise s2 + ReLU, 1x1 to
  2C + BN; an odd grid is zero-padded to even first).
- one LayerNorm ``norm{i}`` per output stage ``i``; ``norm3`` is the official
  final norm, so ``out_indices=(3,)`` gives the final-normed last stage whose
  spatial mean is the official ``forward_features``.

The block (:class:`MLLABlock`), one line each (``DW3`` = depthwise 3x3 conv)::

    x <- x + DW3_cpe1(x)
    g  = SiLU(LN1(x) W_act)
    a  = SiLU(DW3_dwc(LN1(x) W_in))
    x <- x + DropPath((LinearAttentionMixer(a) * g) W_out)
    x <- x + DW3_cpe2(x)
    x <- x + DropPath(MLP(LN2(x)))

with MLLA's attention ``LinearAttentionMixer(rope=True, lepe=True)``
(:mod:`mmdinomamba.models.mixers.linear_attention_mixer`). RoPE is computed for
the grid of each input, so any size, rectangular included, runs: its cos / sin
table once per stage and forward, shared by the stage's blocks.

The paper's designs that live outside the mixer are switches of the same backbone
(its ablations start from a linear-attention Swin-T; ``configs/mlla/ablation/``):

- ``block_design``: 'sub' (above: a Mamba-style block in place of the attention
  sub-block, MLP kept), 'all' (the Mamba-style sub-block alone, no MLP, at
  ``expand`` times the width inside) or 'transformer' (pre-norm, the mixer then an
  output projection, then the MLP)::

      transformer:  x <- x + DropPath(LinearAttentionMixer(LN1(x)) W_out)
      sub, all:     x <- x + DropPath((LinearAttentionMixer(a) * g) W_out),
                    g = SiLU(LN1(x) W_act), a = SiLU(DW3_dwc(LN1(x) W_in))   (E C wide)
      sub, trans.:  x <- x + DropPath(MLP(LN2(x)))

- ``cpe``: the two ``x <- x + DW3_cpe(x)`` lines (one before each sub-block);
- ``ape``: a learnable absolute position embedding per block, added to its input
  (a table for the grid of ``img_size``, resized bicubically for other grids);
- ``stem``: 'conv' (above) or 'patch' (Swin's: 4x4 patches, linear, LayerNorm);
- ``downsample``: 'mbconv' (above) or 'merging' (Swin's: each 2x2 neighbourhood
  concatenated, LayerNorm, linear 4C -> 2C without bias).
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.logging import print_log
from mmengine.model.weight_init import trunc_normal_

from mmdinomamba.models.checkpoint import checkpoint_state_dict
from mmdinomamba.models.mixers import AddLayerNorm, LinearAttentionMixer
from mmdinomamba.models.mixers.positional import RopeTable, grid_conv
from mmdinomamba.models.utils import Mlp, drop_path_or_identity
from mmdinomamba.ops import check_finite
from mmdinomamba.utils import load_official_checkpoint
from mmdinomamba.utils.arg_types import check_arg_types
from .base import (Backbone, Intermediates, TokenLayout, _normalise_indices,
                   mean_readout_layout, resize_pos_embed)
from .mlla_official import convert, is_official, official_weights

Tensor = torch.Tensor
Grid = Tuple[int, int]

MLLA_MIXER = dict(rope=True, lepe=True)  # MLLA's configuration of the mixer
BLOCK_DESIGNS = ('sub', 'all', 'transformer')
STEMS = ('conv', 'patch')
DOWNSAMPLES = ('mbconv', 'merging')


def _check_choice(name: str, value: str, choices: Tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f'MLLA: unknown {name} {value!r}; choose one of {choices}')


def _channels_last(grid: Tensor) -> Tensor:
    """(batch, C, H, W) stored channels-last: the tokens' own layout, so cuDNN's
    NHWC kernels and BatchNorm's channels-last kernels run without layout copies."""
    return grid.contiguous(memory_format=torch.channels_last)


def _tokens(grid: Tensor) -> Tensor:
    """(batch, C, H, W) -> contiguous tokens (batch, H * W, C); a view of a
    channels-last grid. Contiguous tokens keep every later elementwise op, and
    the strides it passes on, on the vectorised dense path."""
    return grid.flatten(2).transpose(1, 2).contiguous()


def _depthwise(dim: int) -> nn.Conv2d:
    return nn.Conv2d(dim, dim, 3, padding=1, groups=dim)


class ConvLayer(nn.Module):
    """``k x k`` conv (padding ``k // 2``), optional BatchNorm, optional ReLU:
    (batch, C_in, H, W) -> (batch, C_out, H', W')."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3,
                 stride: int = 1, groups: int = 1, bias: bool = True, norm: bool = True,
                 act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride,
                              padding=kernel_size // 2, groups=groups, bias=bias)
        self.norm = nn.BatchNorm2d(out_channels) if norm else nn.Identity()
        self.act = nn.ReLU() if act else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.norm(self.conv(x)))


class Stem(nn.Module):
    """(batch, 3, H, W) -> tokens (batch, ceil(H/4) * ceil(W/4), C) and their grid."""

    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        half = dim // 2
        self.conv1 = ConvLayer(in_channels, half, 3, stride=2, bias=False)
        self.conv2 = nn.Sequential(ConvLayer(half, half, 3, bias=False),
                                   ConvLayer(half, half, 3, bias=False, act=False))
        self.conv3 = nn.Sequential(ConvLayer(half, 4 * dim, 3, stride=2, bias=False),
                                   ConvLayer(4 * dim, dim, 1, bias=False, act=False))

    def forward(self, x: Tensor) -> Tuple[Tensor, Grid]:
        x = F.pad(x, (0, -x.shape[-1] % 4, 0, -x.shape[-2] % 4))
        x = self.conv1(_channels_last(x))
        x = self.conv3(self.conv2(x) + x)
        return _tokens(x), tuple(x.shape[-2:])


class PatchStem(nn.Module):
    """Swin's patch embedding: (batch, 3, H, W) -> tokens (batch, ceil(H/4) *
    ceil(W/4), C) and their grid; 4x4 patches (zero-padded at the bottom and right
    to a multiple of 4) through a linear map (a stride-4 convolution), then a
    LayerNorm."""

    def __init__(self, in_channels: int, dim: int, patch_size: int = 4):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tuple[Tensor, Grid]:
        p = self.patch_size
        x = self.proj(F.pad(x, (0, -x.shape[-1] % p, 0, -x.shape[-2] % p)))
        return self.norm(x.flatten(2).transpose(1, 2)), tuple(x.shape[-2:])


class SwinPatchMerging(nn.Module):
    """Swin's downsampling: tokens (batch, H * W, C) -> (batch, ceil(H/2) *
    ceil(W/2), 2C) and the new grid. Each 2x2 neighbourhood (rows r, r + 1,
    columns s, s + 1) is concatenated in Swin's order [(r, s), (r + 1, s),
    (r, s + 1), (r + 1, s + 1)], normalised and mapped 4C -> 2C without bias; an
    odd grid is zero-padded to even first."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = AddLayerNorm(4 * dim)  # nn.LayerNorm, fused on CUDA
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: Tensor, hw: Grid) -> Tuple[Tensor, Grid]:
        h, w = hw
        grid = F.pad(x.unflatten(1, (h, w)), (0, 0, 0, w % 2, 0, h % 2))
        merged = torch.cat([grid[:, 0::2, 0::2], grid[:, 1::2, 0::2],
                            grid[:, 0::2, 1::2], grid[:, 1::2, 1::2]], dim=-1)
        out_hw = tuple(merged.shape[1:3])
        return self.reduction(self.norm(merged.flatten(1, 2))), out_hw


class PatchMerging(nn.Module):
    """Tokens (batch, H * W, C) -> (batch, ceil(H/2) * ceil(W/2), 2C) and the new grid:
    an MBConv without skip (expansion 4 x 2C)."""

    def __init__(self, dim: int, ratio: float = 4.0):
        super().__init__()
        wide = int(2 * dim * ratio)
        self.conv = nn.Sequential(
            ConvLayer(dim, wide, 1, norm=False),
            ConvLayer(wide, wide, 3, stride=2, groups=wide, norm=False),
            ConvLayer(wide, 2 * dim, 1, act=False))

    def forward(self, x: Tensor, hw: Grid) -> Tuple[Tensor, Grid]:
        h, w = hw
        grid = x.transpose(1, 2).unflatten(-1, (h, w))
        if h % 2 or w % 2:
            grid = F.pad(grid, (0, w % 2, 0, h % 2))
        grid = self.conv(_channels_last(grid))
        return _tokens(grid), tuple(grid.shape[-2:])


class MLLABlock(nn.Module):
    """MLLA's block and the paper's other block designs (see the module
    docstring): (batch, H * W, C) -> same.

    Args:
        dim (int): width C.
        num_heads (int): attention heads (``expand * num_heads`` inside a
            Mamba-style design, so the head width stays ``dim / num_heads``).
        mlp_ratio (float): MLP hidden width / C. Defaults to 4.
        drop_path (float): stochastic depth of both residual branches. Defaults to 0.
        qkv_bias (bool): bias of the q/k projection. Defaults to True.
        mixer_cfg (dict, optional): switches of :class:`LinearAttentionMixer`
            over MLLA's own (``rope=True, lepe=True``).
        design (str): 'sub' (MLLA's), 'all' or 'transformer'. Defaults to 'sub'.
        expand (int): width of a Mamba-style design's inside, in units of C
            (the paper's E). Defaults to 1.
        cpe (bool): a depthwise 3x3 conv added before each sub-block. Defaults
            to True.
        ape_grid (tuple, optional): (h, w): add a learnable absolute position
            embedding made for this grid (resized for others). Defaults to None.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0,
                 drop_path: float = 0.0, qkv_bias: bool = True,
                 mixer_cfg: Optional[dict] = None, design: str = 'sub',
                 expand: int = 1, cpe: bool = True, ape_grid: Optional[Grid] = None):
        super().__init__()
        _check_choice('block design', design, BLOCK_DESIGNS)
        if not isinstance(expand, int) or expand < 1 or (
                design == 'transformer' and expand != 1):
            raise ValueError(f'MLLA: expand must be a positive int, and 1 for the '
                             f"'transformer' design, got {expand!r} with {design!r}")
        inner = expand * dim
        self.design = design
        self.ape_grid = None if ape_grid is None else tuple(ape_grid)
        self.absolute_pos_embed = None
        if ape_grid is not None:
            self.absolute_pos_embed = nn.Parameter(
                torch.zeros(1, self.ape_grid[0] * self.ape_grid[1], dim))
            trunc_normal_(self.absolute_pos_embed, std=.02)
        self.cpe1 = _depthwise(dim) if cpe else None
        self.norm1 = AddLayerNorm(dim)  # the add of cpe1 fused in
        if design != 'transformer':
            self.in_proj = nn.Linear(dim, inner)
            self.act_proj = nn.Linear(dim, inner)
            self.dwc = _depthwise(inner)
        self.attn = LinearAttentionMixer(inner, expand * num_heads, qkv_bias=qkv_bias,
                                         **dict(MLLA_MIXER, **(mixer_cfg or {})))
        self.out_proj = nn.Linear(inner, dim)
        self.drop_path = drop_path_or_identity(drop_path)
        self.cpe2 = self.norm2 = self.mlp = None
        if design != 'all':
            self.cpe2 = _depthwise(dim) if cpe else None
            self.norm2 = AddLayerNorm(dim)  # the add of cpe2 fused in
            self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def _mix(self, u: Tensor, hw: Grid,
             rope_table: Optional[RopeTable] = None) -> Tensor:
        """The token-mixing sub-block after LN1, before its residual."""
        if self.design == 'transformer':
            return self.out_proj(self.attn(u, hw, rope_table))
        gate = F.silu(self.act_proj(u))
        a = F.silu(grid_conv(self.dwc, self.in_proj(u), hw))
        return self.out_proj(self.attn(a, hw, rope_table) * gate)

    def forward(self, x: Tensor, hw: Grid,
                rope_table: Optional[RopeTable] = None) -> Tensor:
        """Args: x (Tensor): (batch, H * W, C); hw (tuple): the grid;
        rope_table (tuple, optional): the grid's RoPE table for the mixer
        (:meth:`MLLAStage.rope_table`); None: the mixer builds it.

        Returns:
            Tensor: (batch, H * W, C).
        """
        if self.absolute_pos_embed is not None:
            x = x + resize_pos_embed(self.absolute_pos_embed, self.ape_grid,
                                     tuple(hw)).to(x.dtype)
        x, u = self._cpe_norm(self.cpe1, self.norm1, x, hw)
        x = x + self.drop_path(self._mix(u, hw, rope_table))
        if self.mlp is None:
            return x
        x, u = self._cpe_norm(self.cpe2, self.norm2, x, hw)
        return x + self.drop_path(self.mlp(u))

    @staticmethod
    def _cpe_norm(conv: Optional[nn.Conv2d], norm: AddLayerNorm, x: Tensor,
                  hw: Grid) -> Tuple[Tensor, Tensor]:
        """``x <- x + conv(x)`` (x without CPE) and its LayerNorm, one fused step."""
        if conv is None:
            return x, norm(x)
        return norm(x, grid_conv(conv, x, hw))


class MLLAStage(nn.Module):
    """``depth`` blocks at one width, then (except in the last stage) a downsampling."""

    def __init__(self, dim: int, depth: int, drop_paths: Sequence[float],
                 downsample: Optional[str], block_cfg: dict):
        super().__init__()
        self.blocks = nn.ModuleList(
            MLLABlock(dim, drop_path=drop_paths[j], **block_cfg) for j in range(depth))
        self.downsample = None
        if downsample is not None:
            self.downsample = PatchMerging(dim) if downsample == 'mbconv' \
                else SwinPatchMerging(dim)
        # the switch to the slow twin: False has every mixer call build its own
        # RoPE table (the same numbers, one table per block instead of per stage)
        self.share_rope_table = True

    def rope_table(self, hw: Grid, like: Tensor) -> Optional[RopeTable]:
        """The RoPE table every block of the stage uses on the grid ``hw`` (their
        mixers share the width), for tokens like ``like``; None without RoPE, or
        when :attr:`share_rope_table` is False (each mixer then builds its own)."""
        if not self.share_rope_table:
            return None
        return self.blocks[0].attn.rope_table(hw, like)


class MLLA(Backbone):
    """MLLA backbone (see the module docstring); outputs (batch, C_i, H_i, W_i) maps.

    The analysis API (:mod:`mmdinomamba.analysis.adapters`) counts blocks over
    all stages: ``num_layers`` is ``sum(depths)``, block ``k`` is the ``k``-th
    block in forward order, ``token_mixer(k)`` its attention. Its tokens have no
    readout token: the readout is the mean of all tokens (``readout_type='mean'``).

    Args:
        arch (str | dict): 'tiny'/'t', 'small'/'s', 'base'/'b' (:attr:`arch_zoo`),
            or a dict with ``embed_dims``, ``depths`` and ``num_heads`` (4 each but
            ``embed_dims``) and ``mlp_ratio``. Defaults to 'tiny'.
        img_size (int | tuple): the nominal input size (tools read it for their
            default input); the model takes any size. Defaults to 224.
        in_channels (int): Defaults to 3.
        out_indices (int | Sequence[int]): stages whose final-normed outputs are
            returned, 0-3 (negative from the end). Defaults to (3, ).
        drop_path_rate (float): stochastic depth of the last block, rising linearly
            from 0 over all blocks. Defaults to 0.1.
        qkv_bias (bool): Defaults to True.
        frozen_stages (int): -1 = none; k >= 0 freezes the stem and stages
            ``0 .. k - 1`` (with their downsampling and output norms). Defaults to -1.
        mixer_cfg (dict, optional): switches of every block's
            :class:`LinearAttentionMixer` over MLLA's own.
        block_design (str): 'sub' (MLLA's), 'all' or 'transformer' (see the
            module docstring). Defaults to 'sub'.
        expand (int): a Mamba-style block's inner width / C (the paper's E).
            Defaults to 1.
        cpe (bool): the blocks' conditional position encodings. Defaults to True.
        ape (bool): a learnable absolute position embedding in every block, made
            for the grids of ``img_size``. Defaults to False.
        stem (str): 'conv' (MLLA's) or 'patch' (Swin's). Defaults to 'conv'.
        downsample (str): 'mbconv' (MLLA's) or 'merging' (Swin's). Defaults to
            'mbconv'.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=...,
            prefix=None, strict=True)`` loads an official MLLA file (converted on
            the fly) or one of ours; see :meth:`init_weights`.
    """
    arch_zoo = {
        **dict.fromkeys(['t', 'tiny'], dict(embed_dims=64, depths=[2, 4, 8, 4],
                                            num_heads=[2, 4, 8, 16], mlp_ratio=4.0)),
        **dict.fromkeys(['s', 'small'], dict(embed_dims=64, depths=[3, 6, 21, 6],
                                             num_heads=[2, 4, 8, 16], mlp_ratio=4.0)),
        **dict.fromkeys(['b', 'base'], dict(embed_dims=96, depths=[3, 6, 21, 6],
                                            num_heads=[3, 6, 12, 24], mlp_ratio=4.0)),
    }
    essential_keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratio')
    num_stages = 4
    feature_sources = ('residual', )

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = (3, ),
                 drop_path_rate: float = 0.1,
                 qkv_bias: bool = True,
                 frozen_stages: int = -1,
                 mixer_cfg: Optional[dict] = None,
                 block_design: str = 'sub',
                 expand: int = 1,
                 cpe: bool = True,
                 ape: bool = False,
                 stem: str = 'conv',
                 downsample: str = 'mbconv',
                 init_cfg: Optional[dict] = None):
        check_arg_types(MLLA, locals(), 'MLLA')  # config values' types
        super().__init__(init_cfg=init_cfg)
        _check_choice('stem', stem, STEMS)
        _check_choice('downsample', downsample, DOWNSAMPLES)
        self.arch_settings = self._parse_arch(arch)
        dims = self.arch_settings['embed_dims']
        depths = self.depths = list(self.arch_settings['depths'])
        self.img_size = (img_size, img_size) if isinstance(img_size, int) \
            else tuple(img_size)
        self.dims = [dims * 2 ** i for i in range(self.num_stages)]
        self.out_indices = sorted(set(_normalise_indices(out_indices, self.num_stages)))
        self.frozen_stages = frozen_stages
        self.num_layers = sum(depths)
        self.in_channels = in_channels
        self.patch_embed = Stem(in_channels, dims) if stem == 'conv' \
            else PatchStem(in_channels, dims)
        rates = torch.linspace(0, drop_path_rate, self.num_layers).tolist()
        starts = [sum(depths[:i]) for i in range(self.num_stages)]
        grid = (-(-self.img_size[0] // 4), -(-self.img_size[1] // 4))
        self.layers = nn.ModuleList()
        for i in range(self.num_stages):
            block_cfg = dict(num_heads=self.arch_settings['num_heads'][i],
                             mlp_ratio=self.arch_settings['mlp_ratio'],
                             qkv_bias=qkv_bias, mixer_cfg=mixer_cfg,
                             design=block_design, expand=expand, cpe=cpe,
                             ape_grid=grid if ape else None)
            self.layers.append(MLLAStage(
                self.dims[i], depths[i], rates[starts[i]:starts[i] + depths[i]],
                downsample if i < self.num_stages - 1 else None, block_cfg))
            grid = (-(-grid[0] // 2), -(-grid[1] // 2))
        for i in self.out_indices:
            self.add_module(f'norm{i}', nn.LayerNorm(self.dims[i]))
        # block k in forward order -> (stage, block in stage)
        self.block_index = [(i, j) for i in range(self.num_stages)
                            for j in range(depths[i])]
        # how a stage's blocks run: None = run_stage; CUDAGraphBlocksHook sets a
        # runner replaying them from CUDA graphs (engine.graphed_blocks.GraphedStages)
        self.stage_runner = None
        self.apply(self._init_module)
        self._freeze_stages()

    @classmethod
    def _check_arch(cls, arch: dict) -> None:
        for key in ('depths', 'num_heads'):
            if len(arch[key]) != cls.num_stages:
                raise ValueError(f'MLLA: arch {key} must list {cls.num_stages} stages, '
                                 f'got {arch[key]}')

    # ------------------------------------------------------------ initialisation
    @staticmethod
    def _init_module(m: nn.Module) -> None:
        """The official initialisation: Linear trunc-normal(0.02) with zero bias,
        LayerNorm 1 / 0; convolutions and BatchNorm keep PyTorch's; the mixers'
        gates their own."""
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, LinearAttentionMixer):
            m.init_gates()

    def read_checkpoint_state(self, path: str, map_location='cpu') -> Dict[str, Tensor]:
        """The ``Pretrained`` load's reading of ``path`` (see
        :meth:`Backbone.init_weights`), without unpickling objects
        (:func:`mmdinomamba.utils.load_official_checkpoint`): an official MLLA
        file (``model``, ``state_dict_ema`` or a bare state dict in the official
        layout) is converted by :func:`.mlla_official.convert` (the log says which
        weights it used); any other file is read as ours (``state_dict`` of an
        mmpretrain classifier, or a bare backbone state dict). Output norms
        ``norm{i}`` that the file lacks (a classifier has only ``norm3``) keep
        their initialisation and are logged (:meth:`optional_state_keys`).
        """
        return self.checkpoint_state(load_official_checkpoint(path, map_location), path)

    @staticmethod
    def checkpoint_state(checkpoint, source: str = 'checkpoint') -> Dict[str, Tensor]:
        """The state dict of a loaded file, converted when it is an official one."""
        weights, where = official_weights(checkpoint)
        if is_official(weights):
            print_log(f'{source}: an official MLLA checkpoint; converting its '
                      f'{where!r} weights', logger='current')
            return convert(weights)
        return checkpoint_state_dict(checkpoint, source)

    def optional_state_keys(self) -> List[str]:
        """Keys a checkpoint may lack: the output norms other than the final one."""
        last = self.num_stages - 1
        return [f'norm{i}.{name}' for i in self.out_indices if i != last
                for name in ('weight', 'bias')]

    # ----------------------------------------------------------------- forward
    def _stage_outputs(self, x: Tensor, last_stage: int, block_hook=None):
        """Run the stem and stages ``0 .. last_stage``; yield (stage, tokens, grid)
        after each stage's blocks (before its downsampling). ``block_hook(k, tokens,
        grid)`` sees every block's output (``k`` in forward order) and returns
        False to stop."""
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'MLLA: input must have shape (batch, '
                             f'{self.in_channels}, H, W), got {tuple(x.shape)}')
        check_finite(x, 'MLLA: the batch of input images')
        tokens, hw = self.patch_embed(x)
        k = 0
        for i, stage in enumerate(self.layers[:last_stage + 1]):
            if block_hook is None:
                tokens = (self.stage_runner or self.run_stage)(i, tokens, tuple(hw))
            else:
                rope_table = stage.rope_table(hw, tokens)  # once per grid and stage
                for block in stage.blocks:
                    tokens = block(tokens, hw, rope_table)
                    if block_hook(k, tokens, hw) is False:
                        return
                    k += 1
            yield i, tokens, hw
            if stage.downsample is not None and i < last_stage:
                tokens, hw = stage.downsample(tokens, hw)

    def run_stage(self, i: int, tokens: Tensor, hw: Grid) -> Tensor:
        """Stage ``i``'s blocks (not its downsampling) on ``tokens`` (batch, h * w,
        C_i) of the grid ``hw``, one RoPE table shared by the blocks: the eager way
        (and what :attr:`stage_runner` captures)."""
        stage = self.layers[i]
        rope_table = stage.rope_table(hw, tokens)  # once per grid and stage
        for block in stage.blocks:
            tokens = block(tokens, hw, rope_table)
        return tokens

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """Args: x (Tensor): (batch, C_in, H, W), any H and W.

        Returns:
            tuple: for each of ``out_indices``, (batch, C_i, h_i, w_i), the stage's
            output after its LayerNorm ``norm{i}``.
        """
        outs = []
        for i, tokens, (h, w) in self._stage_outputs(x, self.out_indices[-1]):
            if i in self.out_indices:
                normed = getattr(self, f'norm{i}')(tokens)
                outs.append(normed.transpose(1, 2).unflatten(-1, (h, w)).contiguous())
        return tuple(outs)

    # ------------------------------------------------------ per-layer analysis API
    def token_mixer(self, index: int) -> nn.Module:
        """The :class:`LinearAttentionMixer` of block ``index`` (forward order)."""
        stage, block = self.block_index[index]
        return self.layers[stage].blocks[block].attn

    @staticmethod
    def token_layout(hw: Grid, device=None) -> TokenLayout:
        """Every token is a patch; the readout is their mean."""
        return mean_readout_layout(hw, device)

    def forward_intermediates(self,
                              x: Tensor,
                              indices: Optional[Union[int, Sequence[int]]] = None,
                              feature_source: Optional[str] = None,
                              mixer_inputs: bool = False) -> Intermediates:
        """Per-block tokens, their layouts and (optionally) the mixers' inputs.

        See :meth:`mmdinomamba.models.backbones.PlainBackbone.forward_intermediates`.
        Blocks of different stages have different grids: read each block's with
        ``Intermediates.layout_of(k)`` (``layout`` is the last requested block's).
        The only feature source is 'residual' (the block outputs as they are).

        Args:
            x (Tensor): (batch, C_in, H, W).
            indices (int | Sequence[int], optional): blocks in forward order,
                negative from the end; None = all.
            feature_source (str, optional): None or 'residual'.
            mixer_inputs (bool): also return each requested block's mixer input.

        Returns:
            Intermediates: features {k: (batch, h_k * w_k, C_k)}, layouts, inputs.
        """
        indices = self._intermediate_indices(indices, feature_source)
        features, layouts = {}, {}

        def keep(k, tokens, hw):
            if k in indices:
                features[k] = tokens
                layouts[k] = self.token_layout(hw, tokens.device)
            return k < indices[-1]

        with self._mixer_input_capture(indices, mixer_inputs) as captured:
            for _ in self._stage_outputs(x, self.num_stages - 1, keep):
                pass
        return Intermediates(features, layouts[indices[-1]], captured, layouts)

    # ------------------------------------------------------- training utilities
    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        frozen = [self.patch_embed] + list(self.layers[:self.frozen_stages])
        frozen += [getattr(self, f'norm{i}') for i in self.out_indices
                   if i < self.frozen_stages]
        for module in frozen:
            module.eval()
            for p in module.parameters():
                p.requires_grad = False

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """Layer id of a parameter for layer-wise learning-rate decay.

        The stem is layer 0, block ``k`` (forward order) layer ``k + 1``, a stage's
        downsampling the layer of its last block, and the output norms (and
        anything outside the backbone, e.g. the head) ``sum(depths) + 1``.

        Args:
            param_name (str): e.g. ``'backbone.layers.2.blocks.3.attn.qk.weight'``.
            prefix (str): stripped first (e.g. ``'backbone.'``).

        Returns:
            tuple: (layer id, number of layers = ``sum(depths) + 2``).
        """
        num_layers = self.num_layers + 2
        if not param_name.startswith(prefix):
            return num_layers - 1, num_layers
        parts = param_name[len(prefix):].split('.')
        if parts[0] == 'patch_embed':
            return 0, num_layers
        if parts[0] == 'layers':
            stage = int(parts[1])
            done = sum(self.depths[:stage])
            if parts[2] == 'blocks':
                return done + int(parts[3]) + 1, num_layers
            return done + self.depths[stage], num_layers
        return num_layers - 1, num_layers

