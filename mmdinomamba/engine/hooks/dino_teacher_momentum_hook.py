"""Teacher EMA momentum of DINO: cosine from ``base_momentum`` to ``final_momentum``."""
import math

from mmengine.hooks import Hook

from .utils import find_attr, unwrap_model


class DINOTeacherMomentumHook(Hook):
    """Set ``model.teacher_momentum`` (paper convention) before every iteration.

    The paper's schedule over the ``T = max_iters`` optimizer steps::

        m(i) = final - (final - base) * (1 + cos(pi * i / T)) / 2

    :class:`~mmdinomamba.models.selfsup.DINO` applies the EMA step that follows
    optimizer step ``i - 1`` at the start of iteration ``i``, so iteration ``i``
    gets ``m(i - 1)`` (and iteration 0, where teacher == student, gets ``m(0)``).

    Args:
        base_momentum (float): m(0). Defaults to 0.996.
        final_momentum (float): m(T). Defaults to 1.0.
    """
    priority = 'NORMAL'

    def __init__(self, base_momentum: float = 0.996, final_momentum: float = 1.0):
        for name, value in (('base_momentum', base_momentum),
                            ('final_momentum', final_momentum)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f'DINOTeacherMomentumHook: {name} must be in '
                                 f'[0, 1], got {value}')
        self.base_momentum = base_momentum
        self.final_momentum = final_momentum

    def momentum_at(self, step: int, total_steps: int) -> float:
        """m(step) of the cosine schedule over ``total_steps`` steps."""
        cosine = (1.0 + math.cos(math.pi * step / total_steps)) / 2.0
        return self.final_momentum - (self.final_momentum - self.base_momentum) * cosine

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        model = unwrap_model(runner.model)
        find_attr(model, 'teacher_momentum', type(self).__name__)
        momentum = self.momentum_at(max(runner.iter - 1, 0), runner.max_iters)
        model.teacher_momentum = momentum
        runner.message_hub.update_scalar('train/teacher_momentum', momentum)
