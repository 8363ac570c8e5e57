"""DinoVim: the bidirectional Mamba-2 (SSD) vision backbone of the paper.

"RNN as Linear Transformer: A Closer Investigation into Representational
Potentials of Visual Mamba Models" (CVPR 2026), https://arxiv.org/abs/2511.18380.
With ``num_registers > 0`` it is DinoMamba-Reg.
"""
import copy
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_

from mmdinomamba.models.mixers import SSDMixer
from mmdinomamba.models.utils import DropPath, drop_path_or_identity, linear_rates
from mmdinomamba.ops import (CHUNK_SIZE, BlockParams, BlockSpec, RMSNorm, add_rms_norm,
                             run_blocks)
from mmdinomamba.utils.arg_types import check_arg_types
from .base import PatchEmbed, PlainBackbone, TokenLayout

Tensor = torch.Tensor
# (tokens, indices) -> per index, ascending, the block's (h, residual)
StackRunner = Callable[[Tensor, Sequence[int]], List[Tuple[Tensor, Tensor]]]

FEATURE_SOURCES = ('residual', 'normed', 'mixer')
# nn.Module's global hooks (torch.nn.modules.module.register_module_forward_hook...)
_GLOBAL_HOOKS = ('_global_forward_hooks', '_global_forward_pre_hooks',
                 '_global_backward_hooks', '_global_backward_pre_hooks')


class MambaBlock(nn.Module):
    """Pre-norm block "add -> RMSNorm -> mixer", residual stream kept in fp32.

    ``forward(h, residual, scale)`` returns the new ``(h, residual)`` pair: the
    mixer output and the stream it was computed from (``residual`` is None for the
    first block, whose input is the stream itself). ``scale`` (batch,) is the
    stochastic-depth factor of ``h``; None: the block draws its own. The add and the
    norm are one fused kernel on CUDA (:func:`mmdinomamba.ops.add_rms_norm`).
    :func:`mmdinomamba.ops.run_blocks` runs a stack of these in one call.
    """

    def __init__(self, dim: int, mixer_cfg: dict, drop_path: float = 0.0,
                 norm_eps: float = 1e-5):
        super().__init__()
        self.norm = RMSNorm(dim, eps=norm_eps)
        self.mixer = SSDMixer(dim, **mixer_cfg)
        self.drop_path = drop_path_or_identity(drop_path)

    def forward(self, h: Tensor, residual: Optional[Tensor],
                scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        # stochastic depth of the previous block's output, applied inside the add
        if residual is None:
            scale = None
        elif scale is None and isinstance(self.drop_path, DropPath):
            scale = self.drop_path.sample_scale(h)
        residual, normed = add_rms_norm(h, residual, self.norm.weight, self.norm.eps,
                                        scale)
        return self.mixer(normed), residual

    def params(self) -> BlockParams:
        """The block's parameters as :func:`mmdinomamba.ops.run_blocks` takes them."""
        in_proj = self.mixer.in_proj
        return BlockParams(self.norm.weight, in_proj.weight, in_proj.bias,
                           self.mixer.core_params())

    def spec(self) -> BlockSpec:
        """The block's sizes as :func:`mmdinomamba.ops.run_blocks` takes them."""
        return BlockSpec(self.norm.eps, self.mixer.spec)


class DinoVim(PlainBackbone):
    """DinoVim / DinoMamba-Reg backbone.

    Token layout (as the official models, so released weights load):

    * ``num_registers == 0``: a [CLS] token is prepended to the N patches and the
      position embedding (N + 1 slots, slot 0 for [CLS]) is added; the same [CLS]
      parameter is then inserted once more, without position embedding, at index
      ``(N + 1) // 2`` (98 for 224 px). The readout is that middle token.
    * ``num_registers == R > 0``: no [CLS]; patches get an N-slot position
      embedding; register ``r`` (``cls_token[:, r] + pos_embed_cls[:, r]``) is
      placed after patch ``(r + 1) * s - 1`` with ``s = N // (R + 1)``; the
      remaining patches come last. The readout is the mean of the registers.

    Blocks: ``residual = residual + drop_path(h)``; ``h = mixer(RMSNorm(residual))``.
    The final output is ``RMSNorm_f(residual + h)``.

    Args:
        arch (str | dict): 'tiny'/'t', 'small'/'s', 'base'/'b' or a dict with
            ``embed_dims`` and ``num_layers``. Defaults to 'base'.
        img_size (int | tuple): size the position embedding is made for; other
            sizes are interpolated bicubically. Defaults to 224.
        patch_size (int): Defaults to 16.
        in_channels (int): Defaults to 3.
        num_registers (int): 0 for the middle [CLS], 12 for DinoMamba-Reg.
        out_indices (int | Sequence[int]): blocks to output, negative allowed.
            Defaults to -1.
        out_type (str): 'cls_token' (readout), 'featmap' (batch, dim, H/16, W/16),
            'avg_featmap' or 'raw'. Defaults to 'cls_token'.
        feature_source (str): what a block's output is. 'residual': the stream
            ``residual + h`` (final-normed for the last block if ``final_norm``);
            'normed': the stream, final-normed at every block; 'mixer':
            ``RMSNorm_f(h)``, the official per-layer output used for linear
            probing. Defaults to 'residual'.
        final_norm (bool): apply ``norm_f`` to the last block. Defaults to True.
        drop_path_rate (float): stochastic depth, rising linearly. Defaults to 0.1.
        mixer_cfg (dict, optional): overrides of :class:`SSDMixer` arguments.
        norm_eps (float): RMSNorm eps. Defaults to 1e-5.
        frozen_stages (int): freeze embeddings and this many blocks. Defaults to -1.
        init_cfg (dict, optional): e.g. ``dict(type='Pretrained', checkpoint=...)``.

    Attributes:
        stack_runner (callable, optional): the one seam for how the blocks run:
            ``stack_runner(tokens, indices)`` returns, per index (sorted, unique),
            the block's ``(h, residual)``, as :meth:`run_blocks` does. None (the
            default) runs :meth:`run_blocks`; :meth:`loop_blocks` calls the block
            modules one at a time (the same numbers); a runner that replays CUDA
            graphs is :class:`mmdinomamba.engine.graphed_blocks.GraphedStack`
            (set by ``CUDAGraphBlocksHook``).
    """
    arch_zoo = {
        **dict.fromkeys(['t', 'tiny'], dict(embed_dims=256, num_layers=24)),
        **dict.fromkeys(['s', 'small'], dict(embed_dims=512, num_layers=24)),
        **dict.fromkeys(['b', 'base'], dict(embed_dims=768, num_layers=24)),
    }
    essential_keys = ('embed_dims', 'num_layers')
    feature_sources = FEATURE_SOURCES
    default_mixer_cfg = dict(d_state=64, d_conv=4, expand=2, headdim=64, ngroups=1,
                             chunk_size=CHUNK_SIZE, bidirectional=True,
                             ssd_backend='auto')

    def __init__(self,
                 arch: Union[str, dict] = 'base',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 patch_size: int = 16,
                 in_channels: int = 3,
                 num_registers: int = 0,
                 out_indices: Union[int, Sequence[int]] = -1,
                 out_type: str = 'cls_token',
                 feature_source: str = 'residual',
                 final_norm: bool = True,
                 drop_path_rate: float = 0.1,
                 mixer_cfg: Optional[dict] = None,
                 norm_eps: float = 1e-5,
                 frozen_stages: int = -1,
                 init_cfg: Optional[dict] = None):
        check_arg_types(DinoVim, locals(), 'DinoVim')  # config values' types
        super().__init__(arch, img_size, patch_size, out_indices, out_type,
                         final_norm, frozen_stages, init_cfg)
        if feature_source not in FEATURE_SOURCES:
            raise ValueError(f'DinoVim: unknown feature_source {feature_source!r}; '
                             f'choose one of {FEATURE_SOURCES}')
        if num_registers < 0:
            raise ValueError(f'DinoVim: num_registers must be >= 0, got {num_registers}')
        self.feature_source = feature_source
        self.num_registers = num_registers
        self.num_pos_prefix = 0 if num_registers else 1
        dim = self.embed_dims
        num_patches = self.patch_resolution[0] * self.patch_resolution[1]

        self.patch_embed = PatchEmbed(in_channels, dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, max(num_registers, 1), dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + self.num_pos_prefix,
                                                  dim))
        if num_registers:
            self.pos_embed_cls = nn.Parameter(torch.zeros(1, num_registers, dim))

        mixer_cfg = {**self.default_mixer_cfg, **(mixer_cfg or {})}
        dpr = [0.0] + linear_rates(drop_path_rate, self.num_layers)
        self.layers = nn.ModuleList(
            MambaBlock(dim, copy.deepcopy(mixer_cfg), dpr[i], norm_eps)
            for i in range(self.num_layers))
        self.norm_f = RMSNorm(dim, eps=norm_eps)
        self.drop_path = drop_path_or_identity(drop_path_rate)
        self.stack_runner: Optional[StackRunner] = None
        self._keep_probs: Dict[torch.device, Tensor] = {}  # per device, made once
        # the modules the block loop calls (their hooks keep the blocks in the loop)
        self._hookable = [m for layer in self.layers
                          for m in (layer, layer.mixer, layer.mixer.in_proj)]
        self._init_embeddings()
        self._rescale_out_proj()
        self._freeze_stages()

    def _rescale_out_proj(self):
        # GPT-2 style: each residual branch's last projection scaled by 1/sqrt(depth)
        with torch.no_grad():
            for layer in self.layers:
                layer.mixer.out_proj.weight.div_(self.num_layers ** 0.5)

    def _init_embeddings(self):
        trunc_normal_(self.pos_embed, std=.02)
        trunc_normal_(self.cls_token, std=.02)
        if self.num_registers:
            trunc_normal_(self.pos_embed_cls, std=.02)

    def init_weights(self):
        super().init_weights()
        if not (isinstance(self.init_cfg, dict)
                and self.init_cfg.get('type') == 'Pretrained'):
            self._init_embeddings()

    # ---------------------------------------------------------------- layout
    def token_layout(self, hw: Tuple[int, int], device=None) -> TokenLayout:
        """Positions of the readout and patch tokens for a grid ``hw``."""
        n = hw[0] * hw[1]
        j = torch.arange(n, device=device)
        if self.num_registers == 0:
            mid = (n + 1) // 2
            # sequence [CLS, p_0 .. p_{n-1}] with [CLS] re-inserted at `mid`
            # torch.full, not torch.tensor: no host-to-device copy (CUDA-graph safe)
            return TokenLayout(readout=torch.full((1, ), mid, device=device),
                               patches=torch.where(j + 1 < mid, j + 1, j + 2), hw=hw)
        R = self.num_registers
        s = n // (R + 1)
        if s == 0:
            raise ValueError(f'DinoVim: a {hw} grid is too small for {R} registers')
        r = torch.arange(R, device=device)
        return TokenLayout(readout=r * (s + 1) + s,
                           patches=torch.where(j < R * s, j + j // s, j + R), hw=hw,
                           readout_type='registers')

    def embed(self, x: Tensor) -> Tuple[Tensor, TokenLayout]:
        """(batch, 3, H, W) -> token sequence (batch, seqlen, dim) and its layout."""
        patches, hw = self.patch_embed(x)
        batch, n, dim = patches.shape
        layout = self.token_layout(hw, x.device)
        pos = self.pos_embed_for(hw)
        tokens = patches.new_empty(batch, n + len(layout.readout) +
                                   (0 if self.num_registers else 1), dim)
        if self.num_registers:
            tokens[:, layout.patches] = (patches + pos).to(tokens.dtype)
            tokens[:, layout.readout] = (self.cls_token + self.pos_embed_cls).to(
                tokens.dtype).expand(batch, -1, -1)
            return tokens, layout
        cls = self.cls_token.to(patches.dtype).expand(batch, -1, -1)
        seq = torch.cat([cls, patches], dim=1) + pos.to(patches.dtype)
        mid = (n + 1) // 2  # = layout.readout[0], without reading the device
        return torch.cat([seq[:, :mid], cls, seq[:, mid:]], dim=1), layout

    # ---------------------------------------------------------------- blocks
    def forward_tokens(self, tokens: Tensor, indices: Sequence[int],
                       feature_source: Optional[str] = None,
                       hw: Optional[Tuple[int, int]] = None) -> List[Tensor]:
        """Run the blocks; return the (batch, seqlen, dim) output of each index
        (``hw``, the patch grid, is not needed: the scan runs on the sequence).

        Stops after the last requested block. The blocks run through
        :attr:`stack_runner` (by default :meth:`run_blocks`: one call of
        :func:`mmdinomamba.ops.run_blocks`, on CUDA one autograd node of fused
        kernels). Hooks registered on a block, its mixer or ``in_proj`` see the calls
        they would see eagerly: with any of them the block modules run one at a time
        (:meth:`loop_blocks`).
        """
        source = feature_source or self.feature_source
        wanted = sorted(set(indices))
        if self._hooked():
            pairs = self.loop_blocks(tokens, wanted)
        else:
            pairs = (self.stack_runner or self.run_blocks)(tokens, wanted)
        outs = {i: self._block_output(h, residual, i, source)
                for i, (h, residual) in zip(wanted, pairs)}
        return [outs[i] for i in indices]

    def _hooked(self) -> bool:
        """Whether a hook waits for a call of the modules the block loop calls (a
        block, its mixer, ``in_proj``), or a global module hook is set."""
        if any(getattr(nn.modules.module, name, None) for name in _GLOBAL_HOOKS):
            return True
        return any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                   or m._backward_pre_hooks for m in self._hookable)

    def run_blocks(self, tokens: Tensor, indices: Sequence[int]
                   ) -> List[Tuple[Tensor, Tensor]]:
        """``(h, residual)`` after each block of ``indices`` (sorted, unique), the
        blocks run in one call of :func:`mmdinomamba.ops.run_blocks` with one
        stochastic-depth draw for the whole stack."""
        return run_blocks(tokens, [layer.params() for layer in self.layers],
                          [layer.spec() for layer in self.layers],
                          self._drop_scales(tokens), indices)

    def loop_blocks(self, tokens: Tensor, indices: Sequence[int]
                    ) -> List[Tuple[Tensor, Tensor]]:
        """As :meth:`run_blocks`, with the block modules called one at a time (what
        their hooks see): the same draw, the same numbers."""
        h, residual = tokens, None
        scales = self._drop_scales(tokens)
        pairs = []
        for i, layer in enumerate(self.layers[:indices[-1] + 1]):
            h, residual = layer(h, residual, scales[i] if scales is not None else None)
            if i in indices:
                pairs.append((h, residual))
        return pairs

    def _drop_scales(self, tokens: Tensor) -> Optional[Tensor]:
        """The blocks' stochastic-depth factors for this batch, one draw for all:
        (num_layers, batch) float32, 0 or ``1 / keep`` (row ``i`` for block ``i``'s
        add; rows of rate 0 are 1). None in eval mode or without drop path."""
        if not self.training:
            return None
        keep = self._keep_probs.get(tokens.device)
        if keep is None:
            rates = [layer.drop_path.p if isinstance(layer.drop_path, DropPath) else 0.0
                     for layer in self.layers]
            if not any(rates):
                return None
            keep = self._keep_probs[tokens.device] = torch.tensor(
                [[1.0 - p] for p in rates], device=tokens.device)
        return torch.empty(len(keep), tokens.shape[0],
                           device=tokens.device).bernoulli_(keep).div_(keep)

    def _block_output(self, h: Tensor, residual: Tensor, i: int, source: str) -> Tensor:
        """Block ``i``'s output as ``source`` defines it, from its ``(h, residual)``."""
        if source == 'mixer':
            return self.norm_f(h)
        last = i == self.num_layers - 1
        stream = residual + (self.drop_path(h) if last else h)
        normed = source == 'normed' or (last and self.final_norm)
        return self.norm_f(stream.to(self.norm_f.weight.dtype)) if normed else stream

    def get_intermediate_layers(self, x: Tensor, n: int = 1) -> List[Tensor]:
        """The official per-layer readouts ``RMSNorm_f(h_i)`` of the last ``n`` blocks.

        Args:
            x (Tensor): (batch, 3, H, W).
            n (int): number of last blocks.

        Returns:
            list[Tensor]: ``n`` tensors of (batch, dim), oldest first.
        """
        tokens, layout = self.embed(x)
        indices = list(range(self.num_layers - n, self.num_layers))
        feats = self.forward_tokens(tokens, indices, feature_source='mixer')
        return [f[:, layout.readout].mean(dim=1) for f in feats]

    def token_mixer(self, index: int) -> nn.Module:
        """The :class:`SSDMixer` of block ``index``."""
        return self.layers[index].mixer

    # ------------------------------------------------------ training utilities
    def final_norm_modules(self):
        return [self.norm_f]

    def embedding_param_names(self):
        return ['pos_embed', 'cls_token'] + (['pos_embed_cls'] if self.num_registers
                                             else [])
