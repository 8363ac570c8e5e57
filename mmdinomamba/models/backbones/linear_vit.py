"""LinearViT: a ViT whose attention is linear (the paper's linear-attention baseline)."""
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model.weight_init import trunc_normal_

from mmdinomamba.models.mixers import LinearAttention
from mmdinomamba.models.utils import Mlp, drop_path_or_identity, linear_rates
from mmdinomamba.utils.arg_types import check_arg_types
from .base import PatchEmbed, PlainBackbone, TokenLayout

Tensor = torch.Tensor

FEATURE_SOURCES = ('residual', 'normed')


class LinearViTBlock(nn.Module):
    """Pre-norm ViT block with linear attention."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, drop_path: float,
                 qkv_bias: bool = True, norm_eps: float = 1e-6):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = LinearAttention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path = drop_path_or_identity(drop_path)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class LinearViT(PlainBackbone):
    """ViT with linear attention ``norm(phi(Q) phi(K)^T) V``, computed in O(L).

    [CLS] at position 0, absolute position embedding (N + 1 slots), pre-norm
    blocks, final LayerNorm.

    Args:
        arch (str | dict): 'tiny'/'t' (192 wide, 3 heads), 'small'/'s' (384, 6),
            'base'/'b' (768, 12), all 12 deep with MLP ratio 4; or a dict with
            ``embed_dims``, ``num_layers``, ``num_heads``, ``mlp_ratio``.
        img_size (int | tuple): Defaults to 224.
        patch_size (int): Defaults to 16.
        in_channels (int): Defaults to 3.
        out_indices (int | Sequence[int]): Defaults to -1.
        out_type (str): see :class:`PlainBackbone`. Defaults to 'cls_token'.
        feature_source (str): 'residual' (block outputs, final norm on the last
            block if ``final_norm``) or 'normed' (final norm on every output, as
            DINO's linear probe). Defaults to 'residual'.
        final_norm (bool): Defaults to True.
        drop_path_rate (float): Defaults to 0.1.
        qkv_bias (bool): Defaults to True.
        frozen_stages (int): Defaults to -1.
        init_cfg (dict, optional): initialisation / ``Pretrained`` config.
    """
    arch_zoo = {
        **dict.fromkeys(['t', 'tiny'], dict(embed_dims=192, num_layers=12,
                                            num_heads=3, mlp_ratio=4)),
        **dict.fromkeys(['s', 'small'], dict(embed_dims=384, num_layers=12,
                                             num_heads=6, mlp_ratio=4)),
        **dict.fromkeys(['b', 'base'], dict(embed_dims=768, num_layers=12,
                                            num_heads=12, mlp_ratio=4)),
    }
    essential_keys = ('embed_dims', 'num_layers', 'num_heads', 'mlp_ratio')
    num_pos_prefix = 1
    feature_sources = FEATURE_SOURCES

    def __init__(self,
                 arch: Union[str, dict] = 'base',
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
                 init_cfg: Optional[dict] = None):
        check_arg_types(LinearViT, locals(), 'LinearViT')  # config values' types
        super().__init__(arch, img_size, patch_size, out_indices, out_type,
                         final_norm, frozen_stages, init_cfg)
        if feature_source not in FEATURE_SOURCES:
            raise ValueError(f'LinearViT: unknown feature_source {feature_source!r}; '
                             f'choose one of {FEATURE_SOURCES}')
        self.feature_source = feature_source
        dim = self.embed_dims
        num_patches = self.patch_resolution[0] * self.patch_resolution[1]
        self.patch_embed = PatchEmbed(in_channels, dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, dim))
        dpr = linear_rates(drop_path_rate, self.num_layers)
        self.layers = nn.ModuleList(
            LinearViTBlock(dim, self.arch_settings['num_heads'],
                           self.arch_settings['mlp_ratio'], dpr[i], qkv_bias)
            for i in range(self.num_layers))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self._init_embeddings()
        self._freeze_stages()

    def _init_embeddings(self):
        trunc_normal_(self.pos_embed, std=.02)
        trunc_normal_(self.cls_token, std=.02)

    def init_weights(self):
        super().init_weights()
        if not (isinstance(self.init_cfg, dict)
                and self.init_cfg.get('type') == 'Pretrained'):
            self._init_embeddings()
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    trunc_normal_(m.weight, std=.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)

    def token_layout(self, hw: Tuple[int, int], device=None) -> TokenLayout:
        return TokenLayout(readout=torch.zeros(1, dtype=torch.long, device=device),
                           patches=torch.arange(1, hw[0] * hw[1] + 1, device=device),
                           hw=hw)

    def embed(self, x: Tensor) -> Tuple[Tensor, TokenLayout]:
        patches, hw = self.patch_embed(x)
        cls = self.cls_token.to(patches.dtype).expand(patches.shape[0], -1, -1)
        tokens = torch.cat([cls, patches], dim=1) + self.pos_embed_for(hw).to(
            patches.dtype)
        return tokens, self.token_layout(hw, x.device)

    def forward_tokens(self, tokens: Tensor, indices: Sequence[int],
                       feature_source: Optional[str] = None,
                       hw: Optional[Tuple[int, int]] = None) -> List[Tensor]:
        """Run the blocks; the (batch, seqlen, dim) output of each index (``hw``,
        the patch grid, is not needed)."""
        source = feature_source or self.feature_source
        outs = {}
        for i, layer in enumerate(self.layers[:max(indices) + 1]):
            tokens = layer(tokens)
            if i in indices:
                last = i == self.num_layers - 1
                normed = source == 'normed' or (last and self.final_norm)
                outs[i] = self.norm(tokens) if normed else tokens
        return [outs[i] for i in indices]

    def token_mixer(self, index: int) -> nn.Module:
        """The :class:`LinearAttention` of block ``index``."""
        return self.layers[index].attn

    def final_norm_modules(self):
        return [self.norm]

    def embedding_param_names(self):
        return ['pos_embed', 'cls_token']
