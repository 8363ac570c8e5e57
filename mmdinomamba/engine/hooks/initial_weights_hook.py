"""Keep the weights a run starts from, for comparisons against the same init."""
import os.path as osp

from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.runner.checkpoint import weights_to_cpu

from mmdinomamba.utils import save_atomic
from .utils import unwrap_model


class InitialWeightsHook(Hook):
    """Save the model's ``state_dict`` before the first training step.

    "DINO against random init" is only a fair comparison when the random init is
    the one the run started from: another draw of the same initialiser is a
    different network (and for mmpretrain's ViT, a config's ``init_cfg`` decides
    the distribution). This hook writes ``<work_dir>/<filename>`` (atomically,
    rank 0) as ``{'meta': {'epoch': 0, 'iter': 0}, 'state_dict': ...}``, after
    the runner has initialised the weights, so
    ``tools/model_converters/extract_teacher.py`` reads it like any DINO
    checkpoint. A resumed run (``runner.iter > 0``) leaves the file alone. The
    name is not ``epoch_*.pth`` on purpose: no resume logic or "latest
    checkpoint" glob may pick it up, since it holds no optimizer state.

    Args:
        filename (str): file name in the work dir. Defaults to 'init.pth'.
    """
    priority = 'VERY_LOW'

    def __init__(self, filename: str = 'init.pth'):
        if not filename.endswith('.pth') or osp.basename(filename) != filename:
            raise ValueError(f'InitialWeightsHook: filename must be a bare *.pth '
                             f'name, got {filename!r}')
        self.filename = filename

    def before_train(self, runner) -> None:
        if runner.iter > 0 or not is_main_process():
            return
        model = unwrap_model(runner.model)
        path = osp.join(runner.work_dir, self.filename)
        save_atomic(dict(meta=dict(epoch=0, iter=0),
                         state_dict=weights_to_cpu(model.state_dict())), path)
        runner.logger.info(f'InitialWeightsHook: the initial weights are in {path}')
