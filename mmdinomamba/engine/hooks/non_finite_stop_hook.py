"""Stop training at the first non-finite value, before anything is saved, naming
the iteration, the layer and the likely cause."""
import math
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapperDict
from mmengine.runner import EpochBasedTrainLoop

from ...ops import set_finite_checks
from ..finite import any_rank, finite_flags
from .utils import unwrap_model

Tensor = torch.Tensor
# the modules whose outputs are watched: blocks of a stack (children of these
# containers) and the model's own parts (data preprocessor, backbone, neck, head)
STACKS = (nn.ModuleList, nn.Sequential)


def watched_layers(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """The layers whose outputs :class:`NonFiniteStopHook` watches, in the model's
    order: the model's children and every child of a ``ModuleList`` or
    ``Sequential`` (the blocks and stages of a backbone, the layers of a head)."""
    children = {id(m) for m in model.children()}
    layers = []
    for name, module in model.named_modules(remove_duplicate=True):
        if not name or isinstance(module, STACKS):
            continue
        parent = model.get_submodule(name.rpartition('.')[0]) if '.' in name else model
        if id(module) in children or isinstance(parent, STACKS):
            layers.append((name, module))
    return layers


def _floating(value, found: List[Tensor]) -> List[Tensor]:
    """The floating-point tensors in a module's output (nested tuples, lists and
    dicts), detached."""
    if torch.is_tensor(value):
        if value.is_floating_point() and value.numel():
            found.append(value.detach())
    elif isinstance(value, (list, tuple)):
        for v in value:
            _floating(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _floating(v, found)
    return found


def _tracing() -> bool:
    """Whether torch.compile traces or a CUDA graph captures right now (a
    watcher must add nothing to what they record)."""
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


class NonFiniteStopHook(Hook):
    """Stop at the first non-finite value, naming the iteration, the layer and the
    likely cause.

    Every training iteration gets fused checks that read nothing back from the
    device until the iteration ends, then one device read:

    - the weights when the iteration starts (one multi-tensor kernel per dtype);
    - the outputs of the watched layers (:func:`watched_layers`: the data
      preprocessor, the backbone and its blocks, the neck, the head and its
      layers), in the order they complete: one reduction kernel each (the
      largest magnitude), looked at only when the iteration failed; not inside
      ``torch.compile``d modules nor CUDA-graph replays, which then count as one
      layer;
    - the losses: every value the model returns for logging (``loss`` and its
      parts);
    - the gradients the optimizer steps with: an optimizer step pre-hook flags
      each gradient's finiteness from its largest magnitude, one multi-tensor
      kernel per dtype (it runs after clipping and after AMP's unscaling, right
      before the update).

    A NaN or an infinity raises ``FloatingPointError`` naming the iteration, the
    non-finite losses and the first parameter (in the model's order) whose
    gradient is non-finite, the layer where the values first went non-finite and
    the likely cause: weights already non-finite when the iteration started, a
    non-finite input batch, a forward pass that overflowed in that layer, a loss
    that is non-finite from finite outputs, or a backward pass that overflowed.
    While the model's ``train_step`` runs, the ops' own finiteness errors (CPU
    tensors: :func:`~mmdinomamba.ops.check_finite`) are off, so that this report
    is the one a run gets on the CPU as on CUDA; they are on again after each
    step, however it ends (validation and other calls keep them).

    The check runs before the logger and the checkpoint hooks (priority
    ``ABOVE_NORMAL``), so no checkpoint of the broken iteration is written and no
    earlier one is deleted: the last checkpoint stays the last good one, and
    ``--resume`` continues from it. In a distributed run the processes agree
    through one all-reduce of the flag, and all of them stop.

    Under fp16 AMP with a dynamic loss scale, gradients that overflow are part of
    the recipe: the loss scaler skips that step (the optimizer does not step, so no
    gradient is recorded) and lowers the scale. A non-finite *loss* stops the run
    all the same.
    """
    priority = 'ABOVE_NORMAL'

    def __init__(self):
        self._names: Dict[int, Tuple[int, str]] = {}
        self._params: List[Tuple[str, nn.Parameter]] = []
        self._handles: List[object] = []  # forward hooks
        self._step_hooks: List[object] = []  # optimizer step pre-hooks
        self._preprocessor: Optional[nn.Module] = None
        self._steps: List[Tuple[List[nn.Parameter], Tensor]] = []  # (params, flags)
        self._layers: List[Tuple[str, nn.Module]] = []
        # (layer index, the largest magnitude of each of its output tensors): read
        # only when the iteration failed
        self._outputs: List[Tuple[int, List[Tensor]]] = []
        self._weights: Optional[Tuple[Tensor, List[int]]] = None
        self._watching = False
        self._wrapped: Optional[Tuple[nn.Module, object]] = None

    def before_train(self, runner) -> None:
        model = unwrap_model(runner.model)
        self._params = list(model.named_parameters())
        self._names = {id(p): (i, name) for i, (name, p) in enumerate(self._params)}
        self._layers = watched_layers(model)
        self._preprocessor = getattr(model, 'data_preprocessor', None)
        self._wrap_train_step(runner.model)

    def _wrap_train_step(self, model: nn.Module) -> None:
        """Run ``model.train_step`` with the ops' own finiteness checks off (and
        on again however it ends, an exception included)."""
        step = getattr(model, 'train_step', None)
        if step is None:
            return

        def train_step(*args, **kwargs):
            previous = set_finite_checks(False)
            try:
                return step(*args, **kwargs)
            finally:
                set_finite_checks(previous)

        self._wrapped = (model, model.__dict__.get('train_step'))
        model.train_step = train_step
        self._handles += [module.register_forward_hook(self._watcher(i))
                          for i, (_, module) in enumerate(self._layers)]

    def _watcher(self, index: int) -> Callable:
        def watch(module, inputs, output) -> None:
            if not self._watching or _tracing():
                return
            tensors = _floating(output, [])
            if len(tensors) == 1:  # one kernel: the largest magnitude (NaN-propagating)
                self._outputs.append((index, [torch.linalg.vector_norm(
                    tensors[0], float('inf'))]))
            elif tensors:  # one multi-tensor kernel per dtype
                self._outputs.append((index, torch._foreach_norm(tensors,
                                                                 float('inf'))))
        return watch

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        # registered at the first iteration, after every other hook's before_train:
        # this pre-hook then runs last, on the gradients the step really uses (e.g.
        # after DINOFreezeLastLayerHook dropped the frozen layer's)
        if not self._step_hooks:
            wrappers = runner.optim_wrapper.values() \
                if isinstance(runner.optim_wrapper, OptimWrapperDict) \
                else [runner.optim_wrapper]
            self._step_hooks = [w.optimizer.register_step_pre_hook(self._record)
                                for w in wrappers]
        self._steps, self._outputs = [], []
        self._weights = finite_flags([p.detach() for _, p in self._params]) \
            if self._params else None
        self._watching = True

    def _record(self, optimizer, args, kwargs) -> None:
        params = [p for group in optimizer.param_groups for p in group['params']
                  if p.grad is not None]
        if params:
            flags, order = finite_flags([p.grad for p in params])
            self._steps.append(([params[i] for i in order], flags))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        self._watching = False
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
            self._steps, self._outputs = [], []
            return
        bad_losses = plain + [f'{k}={v.item() if v.numel() == 1 else "(non-finite)"}'
                              for k, v in losses.items() if not torch.isfinite(v).all()]
        bad = [self._names.get(id(p), (len(self._names), '(unnamed parameter)'))
               for params, flags in self._steps
               for p, ok in zip(params, flags.tolist()) if not ok]
        gradient = min(bad)[1] if bad else None  # in the model's order
        layer, cause = self._diagnose(bad_losses, gradient)
        self._steps, self._outputs = [], []
        raise FloatingPointError(self._message(runner, batch_idx, bad_losses, gradient,
                                               layer, cause))

    def _diagnose(self, losses: List[str], gradient: Optional[str]
                  ) -> Tuple[Optional[str], Optional[str]]:
        """The layer where values first went non-finite on this process, and the
        likely cause (None, None: nothing non-finite here)."""
        if self._weights is not None:
            flags, order = self._weights
            stale = sorted(i for i, ok in zip(order, flags.tolist()) if not ok)
            if stale:
                name = self._params[stale[0]][0]
                return (name.rpartition('.')[0] or name,
                        f'its weights were already non-finite when the iteration '
                        f'started ({name}, {len(stale)} tensor'
                        f'{"s" if len(stale) > 1 else ""} in all): an earlier update '
                        'overflowed, or the weights were loaded so (check the '
                        'checkpoint or init_cfg, lower the learning rate)')
        first = next((i for i, norms in self._outputs
                      if not all(bool(torch.isfinite(n)) for n in norms)), None)
        if first is not None:
            name, module = self._layers[first]
            if module is self._preprocessor:
                return (name, 'the input batch holds NaN or infinite values (check '
                        'the dataset and its pipeline)')
            return (name, 'the forward pass overflowed here from finite weights and '
                    'finite inputs (activations too large: lower the learning rate '
                    'or the clipping norm, or train in float32 or bfloat16 rather '
                    'than float16)')
        if losses:
            return ('the loss', 'the loss is non-finite although every watched '
                    'layer returned finite values (a log of 0 or a division by 0 '
                    'in the loss?)')
        if gradient:
            return (gradient.rpartition('.')[0] or gradient,
                    'the backward pass overflowed: the loss and the activations '
                    'were finite, this gradient is not (lower the learning rate or '
                    'the clipping norm, or train in float32)')
        return None, None

    def _message(self, runner, batch_idx: int, losses: List[str],
                 gradient: Optional[str], layer: Optional[str],
                 cause: Optional[str]) -> str:
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
        diagnosis = f' Layer: {layer}; likely cause: {cause}.' if layer else ''
        last = runner.message_hub.get_info('last_ckpt')
        kept = (f'the last checkpoint, {last}, is kept: resume from it with --resume'
                if last else 'no checkpoint was written')
        message = (f'{type(self).__name__}: training stopped at {where}: '
                   f'{"; ".join(found)}.{diagnosis} Nothing of this iteration was '
                   f'saved and {kept}.')
        runner.logger.error(message)
        return message

    def after_train(self, runner) -> None:
        if self._wrapped is not None:
            model, own = self._wrapped
            del model.train_step  # the class's method again
            if own is not None:
                model.train_step = own
            self._wrapped = None
        for handle in self._handles + self._step_hooks:
            handle.remove()
        self._handles, self._step_hooks = [], []
        self._watching = False
