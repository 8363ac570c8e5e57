"""Replay the backbones' blocks from CUDA graphs in training, selected in the config."""
from mmengine.hooks import Hook

from mmdinomamba.models.graphed_blocks import use_cuda_graphs
from .utils import unwrap_model


class CUDAGraphBlocksHook(Hook):
    """Before training, switch every backbone of the model that can replay its blocks
    from CUDA graphs (``use_cuda_graphs``: DinoVim) to do so; for DINO that is the
    student's and the teacher's::

        custom_hooks = [..., dict(type='CUDAGraphBlocksHook')]

    An eager DinoVim step is bound by the host's Python (a few dozen launches per
    block, 24 blocks); replayed, each backbone pass is one launch. The kernels and
    the numbers are eager's, nothing compiles, and the captures (one per crop size,
    during the first iteration) take seconds
    (:mod:`mmdinomamba.models.graphed_blocks`). On a CPU the blocks run eagerly, and
    a model without such a backbone (ViT) is left as it is, with a warning.
    """
    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        model = unwrap_model(runner.model)
        names = [n or type(model).__name__ for n in use_cuda_graphs(model)]
        if not names:  # e.g. the ViT-B config, which inherits DinoVim-B's hooks
            runner.logger.warning(
                f'CUDAGraphBlocksHook: no module of the model ({type(model).__name__}) '
                'replays its blocks from CUDA graphs (none has `use_cuda_graphs`, as '
                'DinoVim has); everything runs eagerly')
            return
        runner.logger.info('CUDAGraphBlocksHook: blocks replayed from CUDA graphs in '
                           f'{", ".join(f"`{n}`" for n in names)}')
