"""Gradient clipping per parameter tensor, as the DINO recipe clips.

mmengine's ``clip_grad=dict(max_norm=3.0)`` clips the norm of *all* gradients taken
together. DINO's official training code (and the Dino-Mamba code built on it) clips
every parameter tensor on its own instead::

    for each parameter p:  g_p <- g_p * min(1, max_norm / (||g_p|| + 1e-6))

which is much milder for a model with hundreds of tensors. The two wrappers below
are mmengine's ``OptimWrapper`` and ``AmpOptimWrapper`` with that rule; in a
config::

    optim_wrapper = dict(type='PerParamClipOptimWrapper', clip_grad=dict(max_norm=3.0))

``tools/train.py --amp`` swaps it for ``PerParamClipAmpOptimWrapper`` (the AMP
wrapper unscales the gradients before clipping, as mmengine's does). The logged
``train/grad_norm`` is the norm of all gradients before clipping, as mmengine logs.
"""
from typing import Iterable

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper

Tensor = torch.Tensor


@torch.no_grad()
def clip_grad_norm_per_param_(parameters: Iterable[Tensor], max_norm: float,
                              eps: float = 1e-6) -> Tensor:
    """Scale each gradient whose 2-norm exceeds ``max_norm`` down to ``max_norm``.

    Args:
        parameters (iterable[Tensor]): tensors with ``.grad`` (None is skipped).
        max_norm (float): the largest norm a single gradient keeps, > 0.
        eps (float): added to each norm before dividing (DINO's 1e-6).

    Returns:
        Tensor: the 2-norm of all gradients together, before clipping.
    """
    if max_norm <= 0:
        raise ValueError(f'clip_grad_norm_per_param_: max_norm must be > 0, got '
                         f'{max_norm}')
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.)
    # one multi-tensor launch for the norms and one for the scaling (not two launches
    # per tensor)
    norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32))
    scales = (max_norm / (norms + eps)).clamp(max=1.0)
    torch._foreach_mul_(grads, [s.to(g.dtype) for g, s in zip(grads, scales.unbind())])
    return norms.norm(2)


class _PerParamClip:
    """Replaces the wrapper's clip function; everything else is mmengine's."""

    def __init__(self, *args, clip_grad=None, **kwargs):
        if clip_grad is not None:
            clip_grad = dict(clip_grad)
            clip_type = clip_grad.pop('type', 'norm')
            if clip_type != 'norm' or set(clip_grad) - {'max_norm'}:
                raise ValueError(f'{type(self).__name__}: clip_grad takes only '
                                 f'`max_norm` (and type="norm"), got {clip_grad} '
                                 f'with type {clip_type!r}')
        super().__init__(*args, clip_grad=clip_grad, **kwargs)
        if clip_grad is not None:
            self.clip_func = clip_grad_norm_per_param_


class PerParamClipOptimWrapper(_PerParamClip, OptimWrapper):
    """mmengine's ``OptimWrapper`` with :func:`clip_grad_norm_per_param_`."""


class PerParamClipAmpOptimWrapper(_PerParamClip, AmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` with :func:`clip_grad_norm_per_param_`."""
