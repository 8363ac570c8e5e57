"""An evaluation-only model whose prediction is a backbone's activation map.

With it, ``tools/test.py CONFIG CHECKPOINT`` evaluates Binary-AUC: the model
writes the maps of :func:`mmdinomamba.analysis.activation_maps` into each data
sample under ``activation_map``, the key :class:`mmdinomamba.evaluation.BinaryAUC`
reads. torch + mmengine only.
"""
from typing import List, Optional, Union

import torch
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from mmengine.structures import BaseDataElement

from mmdinomamba.models.checkpoint import checked_backbone_state
from .activation_maps import METHODS, activation_maps, feature_sources
from .adapters import as_backbone, normalise_layers

Tensor = torch.Tensor

MODES = ('predict', 'tensor')


class ActivationMapModel(BaseModel):
    """A backbone whose prediction is the activation map of one layer.

    ``predict`` stores ``activation_map`` (heads, height, width), the per-head
    maps at the input image size, in every data sample; ``tensor`` mode returns
    them as (batch, heads, height, width). There is no loss: the model is for
    ``tools/test.py`` and analysis only.

    Loading a checkpoint (``load_from``, ``tools/test.py CONFIG CHECKPOINT``) takes
    the backbone's tensors from the keys under ``weights_prefix``; by default the
    first of :data:`mmdinomamba.models.checkpoint.BACKBONE_PREFIXES` that the
    checkpoint has: ``'teacher.backbone.'`` (DINO checkpoints: the teacher, as in
    the paper), ``'backbone.'`` (classifiers, linear probes, this model), ...,
    bare backbone keys. Other tensors (heads, the student) are dropped; a
    backbone tensor that the checkpoint lacks, or an unexpected one inside the
    backbone's namespace, raises a ValueError instead of leaving random weights.

    Args:
        backbone (dict | nn.Module): DinoVim, LinearViT or mmpretrain
            VisionTransformer, or its config (built in the current default scope).
        layer (int): block whose map is predicted, negative from the end.
            Defaults to -1.
        method (str): 'cosine' or 'attention', see
            :mod:`mmdinomamba.analysis.activation_maps`. Defaults to 'cosine'.
        num_heads (int, optional): channel groups of the cosine map; None = the
            heads of the layer's mixer.
        feature_source (str, optional): token features of the cosine map; None =
            the backbone's own.
        weights_prefix (str, optional): checkpoint key prefix of the backbone; None
            tries ``BACKBONE_PREFIXES`` in order.
        data_preprocessor (dict, optional): e.g. ``dict(type='ImgDataPreprocessor',
            mean=..., std=..., bgr_to_rgb=True)``.
        init_cfg (dict, optional): initialisation config.
    """

    def __init__(self,
                 backbone: Union[dict, nn.Module],
                 layer: int = -1,
                 method: str = 'cosine',
                 num_heads: Optional[int] = None,
                 feature_source: Optional[str] = None,
                 weights_prefix: Optional[str] = None,
                 data_preprocessor: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        self.backbone = MODELS.build(backbone) if isinstance(backbone, dict) \
            else backbone
        if method not in METHODS:
            raise ValueError(f'ActivationMapModel: unknown method {method!r}; choose '
                             f'one of {METHODS}')
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise ValueError(f'ActivationMapModel: layer must be an int, got {layer!r}')
        normalise_layers([layer], as_backbone(self.backbone).num_layers)
        sources = feature_sources(self.backbone)
        if feature_source is not None and feature_source not in sources:
            raise ValueError(f'ActivationMapModel: unknown feature_source '
                             f'{feature_source!r}; choose one of {sources}')
        self.layer = layer
        self.method = method
        self.num_heads = num_heads
        self.feature_source = feature_source
        self.weights_prefix = weights_prefix
        self._register_load_state_dict_pre_hook(self._select_backbone_weights)

    def maps(self, inputs: Tensor) -> Tensor:
        """(batch, channels, height, width) -> (batch, heads, height, width)."""
        return activation_maps(self.backbone, inputs, self.layer, self.method,
                               self.num_heads, self.feature_source).heads

    def forward(self,
                inputs: Tensor,
                data_samples: Optional[List[BaseDataElement]] = None,
                mode: str = 'predict') -> Union[Tensor, List[BaseDataElement]]:
        """Args: inputs (Tensor): (batch, channels, height, width), normalised."""
        if mode == 'loss':
            raise ValueError('ActivationMapModel is evaluation-only: it has no loss '
                             '(use tools/test.py, not tools/train.py)')
        if mode not in MODES:
            raise ValueError(f'ActivationMapModel: unknown mode {mode!r}; choose one '
                             f'of {MODES}')
        maps = self.maps(inputs)
        if mode == 'tensor':
            return maps
        if data_samples is None:
            data_samples = [BaseDataElement() for _ in range(len(maps))]
        if len(data_samples) != len(maps):
            raise ValueError(f'ActivationMapModel: {len(data_samples)} data samples '
                             f'for {len(maps)} images')
        for sample, heads in zip(data_samples, maps):
            sample.activation_map = heads
        return data_samples

    def _select_backbone_weights(self, state_dict, prefix, *args) -> None:
        """Load pre-hook: move the checkpoint's backbone tensors to ``backbone.``.

        The tensors are chosen and checked by
        :func:`mmdinomamba.models.checkpoint.checked_backbone_state` (strict).
        """
        own = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        used, source = checked_backbone_state(self.backbone, own, self.weights_prefix,
                                              source='ActivationMapModel checkpoint')
        for key in [k for k in state_dict if k.startswith(prefix)]:
            del state_dict[key]
        state_dict.update({f'{prefix}backbone.{k}': v for k, v in used.items()})
        print_log(f'ActivationMapModel: backbone weights from the {source!r} keys '
                  f'of the checkpoint ({len(used)} tensors)', logger='current')
