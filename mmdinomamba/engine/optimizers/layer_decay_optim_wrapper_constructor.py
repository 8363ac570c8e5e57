"""Layer-wise learning-rate decay for plain backbones, asked of the backbone itself.

The BEiT/MAE fine-tuning protocol: parameter ``p`` with layer id ``i`` (embeddings
0, block ``k`` is ``k + 1``, everything after the blocks, neck and heads included,
is ``num_layers + 1``) gets

    lr(p) = base_lr * rate ** (num_layers + 1 - i),
    rate = layer_decay_rate ** (reference_num_layers / num_layers)

(``rate = layer_decay_rate`` without ``reference_num_layers``), and no weight decay if it is a scale, shift or bias (one dimension or fewer:
norm weights, biases, the SSD's ``A_log``/``D``/``dt_bias`` and their backward
twins) or an embedding table (``pos_embed``, ``cls_token``, ``pos_embed_cls`` and
whatever the backbone lists in ``no_weight_decay()``).

The layer id comes from ``model.backbone.get_layer_depth(name, prefix='backbone.')``
(the contract of mmpretrain's ``VisionTransformer`` and of our plain backbones),
so no parameter name is parsed here and the depth is never repeated in a config.
With ``reference_num_layers`` the rate is normalised by that depth: the lr ratio
between the last block and the embeddings is ``layer_decay_rate **
reference_num_layers`` whatever the backbone's depth, so one recipe line serves
the 12-block ViT-B (0.65 per block) and the 24-block DinoVim (0.65 ** (12 / 24)).
"""
from collections import OrderedDict
from typing import Dict, List, Set, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import DefaultOptimWrapperConstructor

EMBEDDING_NAMES = ('pos_embed', 'cls_token', 'pos_embed_cls')
PARAMWISE_KEYS = ('layer_decay_rate', 'reference_num_layers')


class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Optimizer wrapper constructor with layer-wise lr decay and no-decay groups.

    Config (mmseg or mmdet)::

        optim_wrapper = dict(
            optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05),
            constructor='LayerDecayOptimWrapperConstructor',
            paramwise_cfg=dict(layer_decay_rate=0.65, reference_num_layers=12))

    Parameters are grouped by (layer id, decayed or not); each group carries
    ``lr``, ``weight_decay``, ``lr_scale``, ``layer_id`` and ``param_names``.
    Frozen parameters (``requires_grad=False``) are left out. The groups are
    ordered from the largest lr scale to the smallest, so the first group, whose
    lr mmengine logs as ``lr``, has the base lr (the head's).

    Args:
        optim_wrapper_cfg (dict): the ``optim_wrapper`` config; its optimizer
            must set ``lr``.
        paramwise_cfg (dict): ``layer_decay_rate`` (float in (0, 1]), required;
            ``reference_num_layers`` (int > 0, optional): the depth the rate is
            meant for; a backbone of ``n`` blocks then decays by
            ``layer_decay_rate ** (reference_num_layers / n)`` per layer.
    """

    def _validate_cfg(self) -> None:
        if not isinstance(self.paramwise_cfg, dict):
            raise ValueError(f'{type(self).__name__}: paramwise_cfg must be a dict, '
                             f'got {self.paramwise_cfg!r}')
        unknown = set(self.paramwise_cfg) - set(PARAMWISE_KEYS)
        if unknown:
            raise ValueError(f'{type(self).__name__}: unknown paramwise_cfg keys '
                             f'{sorted(unknown)}; choose from {PARAMWISE_KEYS}')
        rate = self.paramwise_cfg.get('layer_decay_rate')
        if not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise ValueError(f'{type(self).__name__}: paramwise_cfg.layer_decay_rate '
                             f'must be a number in (0, 1], got {rate!r}')
        depth = self.paramwise_cfg.get('reference_num_layers')
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                                  or depth <= 0):
            raise ValueError(f'{type(self).__name__}: paramwise_cfg.reference_num_layers '
                             f'must be a positive int or None, got {depth!r}')
        if self.base_lr is None:
            raise ValueError(f'{type(self).__name__}: the optimizer config must set lr')

    def _rate_per_layer(self, num_layers: int) -> float:
        """The decay per layer for a backbone of ``num_layers`` blocks."""
        rate = self.paramwise_cfg['layer_decay_rate']
        reference = self.paramwise_cfg.get('reference_num_layers')
        return rate if reference is None else rate ** (reference / num_layers)

    def add_params(self, params: List[dict], module: nn.Module) -> None:
        """Append the layer-decayed parameter groups of ``module`` to ``params``.

        Args:
            params (list[dict]): the optimizer's parameter groups, extended in
                place.
            module (nn.Module): the whole model; it needs a ``backbone``.
        """
        model = module.module if is_model_wrapper(module) else module
        backbone = getattr(model, 'backbone', None)
        if backbone is None or not hasattr(backbone, 'get_layer_depth'):
            raise ValueError(f'{type(self).__name__}: the model needs a `backbone` '
                             f'with a get_layer_depth(param_name, prefix) method, '
                             f'got {type(backbone).__name__}')
        skip = set(EMBEDDING_NAMES)
        if hasattr(backbone, 'no_weight_decay'):
            skip.update(backbone.no_weight_decay())

        groups: Dict[Tuple[int, bool], dict] = OrderedDict()
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            layer_id, max_id = backbone.get_layer_depth(name, prefix='backbone.')
            decay = not no_weight_decay(name, param.ndim, skip)
            key = (layer_id, decay)
            rate = self._rate_per_layer(num_layers=max_id - 2)
            if key not in groups:
                scale = rate ** (max_id - 1 - layer_id)
                groups[key] = dict(params=[], param_names=[], layer_id=layer_id,
                                   lr_scale=scale, lr=self.base_lr * scale)
                if not decay:
                    groups[key]['weight_decay'] = 0.0
                elif self.base_wd is not None:
                    groups[key]['weight_decay'] = self.base_wd
            groups[key]['params'].append(param)
            groups[key]['param_names'].append(name)
        params.extend(sorted(groups.values(), key=lambda g: -g['lr_scale']))
        no_decay = sum(len(g['params']) for (_, decay), g in groups.items()
                       if not decay)
        min_scale = min(g['lr_scale'] for g in groups.values())
        print_log(f'{type(self).__name__}: {len(groups)} parameter groups, '
                  f'lr decay {rate:.4g} per layer, lr scales {min_scale:.3g}..1, '
                  f'{no_decay} tensors without weight decay', logger='current')


def no_weight_decay(name: str, ndim: int, skip: Set[str]) -> bool:
    """Whether a parameter is exempt from weight decay.

    Args:
        name (str): full parameter name, e.g. ``'backbone.layers.0.mixer.A_log'``.
        ndim (int): its number of dimensions.
        skip (set[str]): embedding names exempt whatever their shape.

    Returns:
        bool: True for 0-d/1-d parameters (norms, biases, ``A_log``, ``D``,
        ``dt_bias``) and for names whose last component is in ``skip``.
    """
    return ndim <= 1 or name.rsplit('.', 1)[-1] in skip
