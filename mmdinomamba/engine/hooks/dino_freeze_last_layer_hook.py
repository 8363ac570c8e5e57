"""Keep DINO's output layer fixed during the first epoch(s)."""
from typing import Optional

from mmengine.hooks import Hook

from .utils import find_attr, unwrap_model


class DINOFreezeLastLayerHook(Hook):
    """Drop the gradients of ``module`` before each optimizer step while frozen.

    As the paper's code, the gradients are computed (and clipped with the others)
    and then discarded right before ``optimizer.step()``, so the optimizer skips
    these parameters entirely: no update, no weight decay, no moment update. The
    hook is an optimizer step pre-hook, so it also works under AMP and DDP.

    Args:
        freeze_epochs (int): epochs ``0 .. freeze_epochs - 1`` are frozen.
            Defaults to 1.
        module (str): dotted name of the module in the (unwrapped) model.
            Defaults to ``'head.last_layer'``.
    """
    priority = 'NORMAL'

    def __init__(self, freeze_epochs: int = 1, module: str = 'head.last_layer'):
        if freeze_epochs < 0:
            raise ValueError(f'DINOFreezeLastLayerHook: freeze_epochs must be >= 0, '
                             f'got {freeze_epochs}')
        self.freeze_epochs = freeze_epochs
        self.module = module
        self._handle: Optional[object] = None

    def before_train(self, runner) -> None:
        module = find_attr(unwrap_model(runner.model), self.module,
                           type(self).__name__)
        params = [p for p in module.parameters() if p.requires_grad]

        def drop_grads(optimizer, args, kwargs):
            if runner.epoch < self.freeze_epochs:
                for p in params:
                    p.grad = None

        self._handle = runner.optim_wrapper.optimizer.register_step_pre_hook(drop_grads)

    def after_train(self, runner) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
