"""Replay the backbones' blocks from CUDA graphs in training, selected in the config."""
from mmengine.hooks import Hook

from mmdinomamba.engine.graphed_blocks import graph_blocks
from .utils import unwrap_model


class CUDAGraphBlocksHook(Hook):
    """Before training, set every backbone of the model that offers a stack runner
    (``stack_runner``: DinoVim) or a stage runner (``stage_runner``: MLLA) to replay
    its blocks from CUDA graphs; for DINO that is the student's and the teacher's::

        custom_hooks = [..., dict(type='CUDAGraphBlocksHook')]

    Args:
        max_signatures (int): captures kept per block stack (MLLA: per stage); inputs
            of further sizes run eagerly. Each training capture holds its own
            activations, so dense pipelines whose inputs vary in size keep it small.
            Defaults to 8.

    An eager DinoVim step is bound by the host's Python (a few dozen launches per
    block, 24 blocks); replayed, each backbone pass is one launch. The kernels and
    the numbers are eager's, nothing compiles, and the captures (one per crop size,
    during the first iteration) take seconds
    (:mod:`mmdinomamba.engine.graphed_blocks`). On a CPU the blocks run eagerly. The
    shipped DinoVim DINO configs and the MLLA classification, ablation and dense
    configs add it; a model without such a backbone is left as it is, with a warning.
    """
    priority = 'VERY_HIGH'

    def __init__(self, max_signatures: int = 8):
        if not isinstance(max_signatures, int) or max_signatures < 1:
            raise ValueError(f'CUDAGraphBlocksHook: max_signatures must be a positive '
                             f'int, got {max_signatures!r}')
        self.max_signatures = max_signatures

    def before_train(self, runner) -> None:
        model = unwrap_model(runner.model)
        names = [n or type(model).__name__ for n in graph_blocks(model, max_signatures=self.max_signatures)]
        if not names:
            runner.logger.warning(
                f'CUDAGraphBlocksHook: no module of the model ({type(model).__name__}) '
                'offers a stack or stage runner (`stack_runner`, as DinoVim does, or '
                '`stage_runner`, as MLLA does), so nothing '
                'replays from CUDA graphs; everything runs eagerly')
            return
        runner.logger.info('CUDAGraphBlocksHook: blocks replayed from CUDA graphs in '
                           f'{", ".join(f"`{n}`" for n in names)}')
