"""PlainMLLA: MLLA's block and mixer on a plain (single-stage) layout.

The comparison recipe (``configs/compare/``) puts token mixers side by side on
plain 12-block backbones of one width and patching (ViT, DinoVim, LinearViT).
This is MLLA's entry among them, so that the models differ in the block and its
token mixer only:

- non-overlapping ``p x p`` patches, linear (:class:`.base.PatchEmbed`), as the
  others, in place of MLLA's stride-4 convolutional stem; no downsampling;
- ``num_layers`` :class:`~.mlla.MLLABlock` at one width on the patch grid (CPE,
  the SiLU-gated sub-block around ``LinearAttentionMixer(rope=True, lepe=True)``,
  the MLP);
- a final LayerNorm; no [CLS] token and no absolute position embedding (CPE,
  RoPE and LePE carry position in MLLA): the readout is the mean of the patch
  tokens (``readout_type='mean'``), what MLLA's classifier pools.
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from mmdinomamba.models.mixers.protocol import require_grid
from mmdinomamba.models.utils import linear_rates
from mmdinomamba.utils.arg_types import check_arg_types
from .base import PatchEmbed, PlainBackbone, TokenLayout, mean_readout_layout
from .mlla import MLLA, MLLABlock

Tensor = torch.Tensor

FEATURE_SOURCES = ('residual', 'normed')


class PlainMLLA(PlainBackbone):
    """MLLA's block on a plain layout (see the module docstring).

    Args:
        arch (str | dict): 'tiny'/'t' (192 wide, 6 heads), 'small'/'s' (384, 12),
            'base'/'b' (768, 24), 12 blocks each, heads of 32 channels as in MLLA,
            MLP ratio 4; or a dict with ``embed_dims``, ``num_layers``,
            ``num_heads``, ``mlp_ratio``. Defaults to 'tiny'.
        img_size (int | tuple): the nominal input size; any size runs. Defaults
            to 224.
        patch_size (int): Defaults to 16.
        in_channels (int): Defaults to 3.
        out_indices (int | Sequence[int]): blocks whose outputs are returned.
            Defaults to -1.
        out_type (str): see :class:`PlainBackbone` ('cls_token' is the mean
            readout). Defaults to 'cls_token'.
        feature_source (str): 'residual' (block outputs, the final norm on the
            last block if ``final_norm``) or 'normed' (the final norm on every
            output). Defaults to 'residual'.
        final_norm (bool): Defaults to True.
        drop_path_rate (float): stochastic depth of the last block, rising
            linearly from 0. Defaults to 0.1.
        qkv_bias (bool): Defaults to True.
        frozen_stages (int): freeze the patch embedding and this many blocks.
            Defaults to -1.
        mixer_cfg (dict, optional): switches of every block's
            :class:`~mmdinomamba.models.mixers.LinearAttentionMixer` over MLLA's.
        init_cfg (dict, optional): initialisation / ``Pretrained`` config.
    """
    arch_zoo = {
        **dict.fromkeys(['t', 'tiny'], dict(embed_dims=192, num_layers=12,
                                            num_heads=6, mlp_ratio=4.0)),
        **dict.fromkeys(['s', 'small'], dict(embed_dims=384, num_layers=12,
                                             num_heads=12, mlp_ratio=4.0)),
        **dict.fromkeys(['b', 'base'], dict(embed_dims=768, num_layers=12,
                                            num_heads=24, mlp_ratio=4.0)),
    }
    essential_keys = ('embed_dims', 'num_layers', 'num_heads', 'mlp_ratio')
    feature_sources = FEATURE_SOURCES

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 img_size: Union[int, Tuple[int, int]] = 224,
                 patch_size: int = 16,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = -1,
                 out_type: str = 'cls_token',
                 feature_source: str = 'residual',
                 final_norm: bool = True,
                 drop_path_rate: float = 0.1,
                 qkv_bias: bool = True,
                 frozen_stages: int = -1,
                 mixer_cfg: Optional[dict] = None,
                 init_cfg: Optional[dict] = None):
        check_arg_types(PlainMLLA, locals(), 'PlainMLLA')  # config values' types
        super().__init__(arch, img_size, patch_size, out_indices, out_type,
                         final_norm, frozen_stages, init_cfg)
        if feature_source not in FEATURE_SOURCES:
            raise ValueError(f'PlainMLLA: unknown feature_source {feature_source!r}; '
                             f'choose one of {FEATURE_SOURCES}')
        self.feature_source = feature_source
        dim = self.embed_dims
        self.patch_embed = PatchEmbed(in_channels, dim, patch_size)
        rates = linear_rates(drop_path_rate, self.num_layers)
        self.layers = nn.ModuleList(
            MLLABlock(dim, self.arch_settings['num_heads'],
                      self.arch_settings['mlp_ratio'], rates[i], qkv_bias, mixer_cfg)
            for i in range(self.num_layers))
        self.norm = nn.LayerNorm(dim)
        self.apply(MLLA._init_module)
        self._freeze_stages()

    def token_layout(self, hw: Tuple[int, int], device=None) -> TokenLayout:
        """Every token is a patch; the readout is their mean."""
        return mean_readout_layout(hw, device)

    def embed(self, x: Tensor) -> Tuple[Tensor, TokenLayout]:
        """(batch, C_in, H, W) -> patch tokens (batch, h * w, dim) and their layout;
        the blocks that follow (:meth:`forward_tokens`) run on its grid ``hw``."""
        tokens, hw = self.patch_embed(x)
        return tokens, self.token_layout(hw, x.device)

    def forward_tokens(self, tokens: Tensor, indices: Sequence[int],
                       feature_source: Optional[str] = None,
                       hw: Optional[Tuple[int, int]] = None) -> List[Tensor]:
        """Run the blocks on the patch grid ``hw`` (``layout.hw`` of
        :meth:`embed`; required); return the (batch, h * w, dim) output of each
        index."""
        hw = require_grid(hw, tokens.shape[1], 'PlainMLLA.forward_tokens')
        source = feature_source or self.feature_source
        outs = {}
        # one RoPE table for every block: one width, one grid
        rope_table = self.layers[0].attn.rope_table(hw, tokens)
        for i, layer in enumerate(self.layers[:max(indices) + 1]):
            tokens = layer(tokens, hw, rope_table)
            if i in indices:
                last = i == self.num_layers - 1
                normed = source == 'normed' or (last and self.final_norm)
                outs[i] = self.norm(tokens) if normed else tokens
        return [outs[i] for i in indices]

    def token_mixer(self, index: int) -> nn.Module:
        """The :class:`LinearAttentionMixer` of block ``index``."""
        return self.layers[index].attn

    def final_norm_modules(self):
        return [self.norm]

    def embedding_param_names(self):
        return []
