"""Stop training at the first non-finite loss or gradient, before anything is saved."""
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapperDict
from mmengine.runner import EpochBasedTrainLoop

from ..finite import any_rank, finite_flags
from .utils import unwrap_model

Tensor = torch.Tensor


class NonFiniteStopHook(Hook):
    """Stop at the first non-finite loss or gradient, naming the iteration and tensor.

    Every training iteration gets one fused check, one device read:

    - the losses: every value the model returns for logging (``loss`` and its
      parts);
    - the gradients the optimizer steps with: an optimizer step pre-hook flags
      each gradient's finiteness from its largest magnitude, one multi-tensor
      kernel per dtype and no device read (it runs after clipping and after AMP's
      unscaling, right before the update).

    A NaN or an infinity raises ``FloatingPointError`` naming the iteration, the
    non-finite losses and the first parameter (in the model's order) whose
    gradient is non-finite. The check runs before the logger and the checkpoint
    hooks (priority ``ABOVE_NORMAL``), so no checkpoint of the broken iteration is
    written and no earlier one is deleted: the last checkpoint stays the last good
    one, and ``--resume`` continues from it. In a distributed run the processes
    agree through one all-reduce of the flag, and all of them stop.

    Under fp16 AMP with a dynamic loss scale, gradients that overflow are part of
    the recipe: the loss scaler skips that step (the optimizer does not step, so no
    gradient is recorded) and lowers the scale. A non-finite *loss* stops the run
    all the same.
    """
    priority = 'ABOVE_NORMAL'

    def __init__(self):
        self._names: Dict[int, Tuple[int, str]] = {}
        self._handles: List[object] = []
        self._steps: List[Tuple[List[nn.Parameter], Tensor]] = []  # (params, flags)

    def before_train(self, runner) -> None:
        model = unwrap_model(runner.model)
        self._names = {id(p): (i, name)
                       for i, (name, p) in enumerate(model.named_parameters())}

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        # registered at the first iteration, after every other hook's before_train:
        # this pre-hook then runs last, on the gradients the step really uses (e.g.
        # after DINOFreezeLastLayerHook dropped the frozen layer's)
        if not self._handles:
            wrappers = runner.optim_wrapper.values() \
                if isinstance(runner.optim_wrapper, OptimWrapperDict) \
                else [runner.optim_wrapper]
            self._handles = [w.optimizer.register_step_pre_hook(self._record)
                             for w in wrappers]
        self._steps = []

    def _record(self, optimizer, args, kwargs) -> None:
        params = [p for group in optimizer.param_groups for p in group['params']
                  if p.grad is not None]
        if params:
            flags, order = finite_flags([p.grad for p in params])
            self._steps.append(([params[i] for i in order], flags))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        losses = {k: v.detach() for k, v in (outputs or {}).items()
                  if torch.is_tensor(v) and v.is_floating_point()}
        plain = [f'{k}={v}' for k, v in (outputs or {}).items()
                 if isinstance(v, float) and not math.isfinite(v)]
        parts = [torch.isfinite(v).reshape(-1) for v in losses.values()]
        parts += [f for _, f in self._steps]
        if not parts and not plain:  # nothing to check (the same on every rank)
            return
        device = parts[0].device if parts else torch.device('cpu')
        finite = torch.cat([p.to(device) for p in parts]).all() if parts \
            else torch.tensor(True)
        flag = ~finite | torch.tensor(bool(plain), device=finite.device)
        if not any_rank(flag):
            self._steps = []
            return
        bad_losses = plain + [f'{k}={v.item() if v.numel() == 1 else "(non-finite)"}'
                              for k, v in losses.items() if not torch.isfinite(v).all()]
        bad = [self._names.get(id(p), (len(self._names), '(unnamed parameter)'))
               for params, flags in self._steps
               for p, ok in zip(params, flags.tolist()) if not ok]
        first = min(bad)[1] if bad else None  # in the model's order
        self._steps = []
        raise FloatingPointError(self._message(runner, batch_idx, bad_losses, first))

    def _message(self, runner, batch_idx: int, losses: List[str],
                 gradient: Optional[str]) -> str:
        where = f'iteration {runner.iter + 1}'
        if isinstance(runner.train_loop, EpochBasedTrainLoop):
            where += (f' (epoch {runner.epoch + 1}, batch {batch_idx + 1} of '
                      f'{len(runner.train_loop.dataloader)})')
        found = []
        if losses:
            found.append('non-finite loss ' + ', '.join(losses))
        if gradient:
            found.append(f'first non-finite gradient: {gradient}')
        if not found:
            found.append('non-finite values on another process')
        last = runner.message_hub.get_info('last_ckpt')
        kept = (f'the last checkpoint, {last}, is kept: resume from it with --resume'
                if last else 'no checkpoint was written')
        message = (f'{type(self).__name__}: training stopped at {where}: '
                   f'{"; ".join(found)}. Nothing of this iteration was saved and {kept} '
                   '(lower the learning rate or the clipping norm, or train in fp32, '
                   'before resuming).')
        runner.logger.error(message)
        return message

    def after_train(self, runner) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
