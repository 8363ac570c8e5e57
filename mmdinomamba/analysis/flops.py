"""Parameters and multiply-accumulates (MACs) of a model: convolutions and matrix
products, as executed.

One MAC is one multiply-add; FLOPs = 2 x MACs. The count runs the model once
under :class:`torch.utils.flop_counter.FlopCounterMode`, which sees every ATen
operator as it is dispatched, after ``einsum``, ``matmul`` and ``F.linear`` have
been lowered to ``mm`` / ``bmm`` / ``addmm``. So what is written as einsums is
counted as it runs:

- the SSD scan (:func:`mmdinomamba.ops.ssd_scan`, the chunked algorithm of the
  PyTorch path): per chunk of Q tokens and head, ``Q^2 (N + P)`` for the
  intra-chunk products, ``Q N P`` for the chunk state and ``Q N P`` for its
  output, plus the inter-chunk recurrence; with its padding, at the chunk size
  the model uses;
- linear attention: ``K^T V`` and ``Q S`` (``N d e`` each per head) and the
  normaliser ``Q . mean(K)`` (``N d``);
- depthwise convolutions (LePE, CPE, Mamba's causal conv: ``k`` MACs per output).

Not counted, by definition: elementwise work and reductions (RoPE's rotations,
gates, activations, norms, softmax, the decay masks), as in the official MLLA
figures (4.13 / 7.25 / 16.11 GMACs for MLLA-T/S/B at 224 px are
``torch.utils.flop_counter`` / 2 of the official model). An einsum whose summed
axis has length 1 (``K^T V`` on a one-token grid) runs as a plain product and
counts nothing.

Handles: :data:`HANDLES` gives formulas for the operators the counter has none
for (softmax attention's fused CPU kernel). Nothing is missed silently: every
dispatched operator whose name says it multiplies (``mm``, ``conv``,
``attention``, ``dot``, ...) must have a formula, else :func:`count_macs` raises
naming it. Fused kernels (Triton, mamba-ssm) bypass the dispatcher altogether,
so models are counted on the CPU, where every model of ours runs its PyTorch
path; tracing plays no part (the input sizes stay Python ints).
"""
import importlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

Tensor = torch.Tensor
aten = torch.ops.aten

__all__ = ['Complexity', 'HANDLES', 'build_model_from_config', 'count_macs',
           'describe', 'model_complexity', 'tensor_forward']


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None,
                **kwargs) -> int:
    """Softmax attention: ``Q K^T`` and ``P V``, ``batch heads L_q L_k (d_qk +
    d_v)`` MACs, returned as FLOPs (the counter's unit, 2 per MAC)."""
    *batch, len_q, d_qk = query_shape
    return 2 * math.prod(batch) * len_q * key_shape[-2] * (d_qk + value_shape[-1])


# operator -> FLOPs formula on the shapes of its arguments (the counter's convention)
HANDLES: Dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops,
}

# names of operators that multiply matrices (or tensors over a contracted axis)
_MULTIPLIES = re.compile(
    r'(^|_)(mm|bmm|addmm|baddbmm|addbmm|matmul|mv|addmv|dot|vdot|linear|einsum|'
    r'tensordot|outer|addr|ger|bilinear)($|_)|attention|conv(olution|\d|_|$)')


class _SeenOperators(TorchDispatchMode):
    """Records every operator dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


def _op_name(op) -> str:
    return str(op).split('.')[-1]


def count_macs(forward: Callable[[], Any]) -> Tuple[int, Dict[str, int]]:
    """MACs of ``forward()`` (conv + matmul), in total and per module.

    Args:
        forward (callable): runs the model once; called without gradients.

    Returns:
        tuple: total MACs, and {module name: MACs} for every module that ran
        (names as ``FlopCounterMode`` gives them: the root's class name, then the
        attribute path, e.g. ``'ImageClassifier.backbone.layers.0'``).
    """
    counter = FlopCounterMode(display=False, custom_mapping=HANDLES)
    seen = _SeenOperators()
    with torch.no_grad(), counter, seen:
        forward()
    missed = sorted(str(op) for op in seen.ops if _MULTIPLIES.search(_op_name(op))
                    and op not in counter.flop_registry)
    if missed:
        raise RuntimeError(f'count_macs: no formula for {missed}, which multiply '
                           'matrices; add one to mmdinomamba.analysis.flops.HANDLES')
    per_module = {name: sum(ops.values()) // 2
                  for name, ops in counter.get_flop_counts().items() if name != 'Global'}
    return counter.get_total_flops() // 2, per_module


@dataclass
class Complexity:
    """What :func:`model_complexity` measured.

    Attributes:
        params (int): parameters of the whole model.
        macs (int): multiply-accumulates of ``counted`` on one input.
        shape (tuple): the input, (batch, channels, height, width).
        counted (str): what ran (e.g. the classifier's ``forward(mode='tensor')``).
        parts (dict): {direct child of the model: MACs} for the children that
            count any, and what ran outside them.
    """
    params: int
    macs: int
    shape: Tuple[int, int, int, int]
    counted: str
    parts: Dict[str, int] = field(default_factory=dict)


def _is_detector(model: nn.Module) -> bool:
    return any(cls.__name__ == 'BaseDetector' for cls in type(model).__mro__)


def tensor_forward(model: nn.Module, inputs: Tensor) -> Tuple[Callable[[], Any], str]:
    """The forward to count for a model of ours, and what it covers.

    - an mmdet detector: ``extract_feat`` (backbone and neck): the heads' cost
      depends on the number of proposals, so it is left out;
    - any other mmengine model (a classifier, a segmentor, DINO):
      ``forward(inputs, mode='tensor')`` (a classifier's backbone, neck and head;
      a segmentor's backbone, neck and decode head, without the auxiliary head;
      DINO's backbone);
    - a bare module (a backbone): ``module(inputs)``.
    """
    from mmengine.model import BaseModel
    name = type(model).__name__
    if _is_detector(model):
        return (lambda: model.extract_feat(inputs),
                f'{name}.extract_feat (backbone and neck; the detection heads depend '
                'on the proposals and are left out)')
    if isinstance(model, BaseModel):
        return (lambda: model(inputs, mode='tensor'), f"{name}.forward(mode='tensor')")
    return lambda: model(inputs), f'{name}.forward'


def model_complexity(model: nn.Module, shape: Sequence[int] = (224, 224),
                     in_channels: int = 3, seed: int = 0) -> Complexity:
    """Parameters and MACs of ``model`` on one (1, in_channels, H, W) input.

    The model runs in eval mode on the CPU (see the module docstring) and is left
    in eval mode.

    Args:
        model (nn.Module): on the CPU.
        shape (Sequence[int]): (H, W). Defaults to (224, 224).
        in_channels (int): Defaults to 3.
        seed (int): of the random input (the count does not depend on it for
            the models here). Defaults to 0.

    Returns:
        Complexity: see its attributes.
    """
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f'model_complexity: shape must be (height, width), got '
                         f'{tuple(shape)}')
    devices = {p.device.type for p in model.parameters()}
    if devices - {'cpu'}:
        raise ValueError(f'model_complexity: the model is on {sorted(devices)}; count '
                         'on the CPU (fused CUDA kernels bypass the dispatcher, so '
                         'their MACs would be missed): call model.cpu() first')
    inputs = torch.randn(1, in_channels, *shape,
                         generator=torch.Generator().manual_seed(seed))
    model.eval()
    forward, counted = tensor_forward(model, inputs)
    macs, per_module = count_macs(forward)
    root = type(model).__name__
    parts = {}
    for child, _ in model.named_children():
        key = f'{root}.{child}'
        # a ModuleList is never called itself: add up its members
        value = per_module.get(key, sum(v for k, v in per_module.items()
                                        if k.startswith(key + '.') and k.count('.') == 2))
        if value:
            parts[child] = value
    if macs > sum(parts.values()):
        parts['(outside the children)'] = macs - sum(parts.values())
    return Complexity(sum(p.numel() for p in model.parameters()), macs,
                      tuple(inputs.shape), counted, parts)


def build_model_from_config(cfg) -> nn.Module:
    """The config's ``model`` built in its default scope's registry (mmpretrain
    when it names none), without loading any weights (``init_weights`` is not
    called), SyncBN layers as BN (they run on the CPU here).

    Args:
        cfg (mmengine.Config): a config of ours.

    Returns:
        nn.Module: on the CPU.
    """
    from mmengine.model import revert_sync_batchnorm
    if 'model' not in cfg:
        raise ValueError('build_model_from_config: the config has no `model`')
    importlib.import_module('mmdinomamba.registry').register_all_modules()
    scope = cfg.get('default_scope') or 'mmpretrain'
    models = importlib.import_module(f'{scope}.registry').MODELS
    with models.switch_scope_and_registry(scope) as registry:
        model = registry.build(cfg.model)
    return revert_sync_batchnorm(model)


def describe(result: Complexity, title: Optional[str] = None) -> str:
    """The tool's report: parameters, MACs (and FLOPs), what ran, the parts."""
    lines = [title] if title else []
    lines += [f'input:  {" x ".join(map(str, result.shape))}',
              f'counted: {result.counted}',
              f'params: {result.params:,} ({result.params / 1e6:.2f} M)',
              f'MACs:   {result.macs:,} ({result.macs / 1e9:.2f} G; conv + matmul, '
              f'FLOPs = 2 x MACs)']
    for name, macs in result.parts.items():
        lines.append(f'  {name:<20}{macs / 1e9:>10.3f} G')
    return '\n'.join(lines)
