"""Teacher-temperature schedule of DINO: linear warm-up per epoch, then constant."""
from mmengine.hooks import Hook

from .utils import find_attr, unwrap_model


class DINOTeacherTempHook(Hook):
    """Set ``model.loss_module.teacher_temp`` at the start of each epoch.

    As in the paper's code, the warm-up is ``linspace(warmup_temp, final_temp,
    warmup_epochs)`` over epochs ``0 .. warmup_epochs - 1``; later epochs use
    ``final_temp``. With ``warmup_epochs=0`` (the official Dino-Mamba recipe) or
    ``warmup_temp == final_temp`` the temperature is constant.

    Args:
        final_temp (float): temperature after the warm-up. Defaults to 0.04.
        warmup_temp (float): temperature of epoch 0. Defaults to 0.04.
        warmup_epochs (int): length of the warm-up. Defaults to 0.
    """
    priority = 'NORMAL'

    def __init__(self, final_temp: float = 0.04, warmup_temp: float = 0.04,
                 warmup_epochs: int = 0):
        if final_temp <= 0 or warmup_temp <= 0:
            raise ValueError(f'DINOTeacherTempHook: temperatures must be > 0, got '
                             f'warmup {warmup_temp}, final {final_temp}')
        if warmup_epochs < 0:
            raise ValueError(f'DINOTeacherTempHook: warmup_epochs must be >= 0, got '
                             f'{warmup_epochs}')
        self.final_temp = final_temp
        self.warmup_temp = warmup_temp
        self.warmup_epochs = warmup_epochs

    def temp_at(self, epoch: int) -> float:
        """The teacher temperature of (0-based) ``epoch``."""
        if epoch >= self.warmup_epochs:
            return self.final_temp
        if self.warmup_epochs == 1:
            return self.warmup_temp
        frac = epoch / (self.warmup_epochs - 1)
        return self.warmup_temp + (self.final_temp - self.warmup_temp) * frac

    def before_train_epoch(self, runner) -> None:
        loss = find_attr(unwrap_model(runner.model), 'loss_module', type(self).__name__)
        loss.teacher_temp = self.temp_at(runner.epoch)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        runner.message_hub.update_scalar('train/teacher_temp', self.temp_at(runner.epoch))
