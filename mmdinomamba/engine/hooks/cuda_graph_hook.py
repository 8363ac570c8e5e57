"""Replay the backbones' blocks from CUDA graphs in training and testing, selected in
the config."""
from mmengine.hooks import Hook

from mmdinomamba.engine.graphed_blocks import graph_blocks, graphed_modules, on_cuda
from .utils import unwrap_model

# the inference bounds of runs that only test or validate, and of the inferencers
TEST_MAX_SIGNATURES = 16
TEST_CAPTURE_AFTER = 2


def _positive_int(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f'CUDAGraphBlocksHook: {name} must be a positive int, '
                         f'got {value!r}')
    return value


class CUDAGraphBlocksHook(Hook):
    """Set every backbone of the model that offers a stack runner (``stack_runner``:
    DinoVim) or a stage runner (``stage_runner``: MLLA) to replay its blocks from
    CUDA graphs, one graph per input signature (shape, dtype, autocast state, the
    blocks whose outputs are asked for); for DINO that is the student's and the
    teacher's::

        custom_hooks = [..., dict(type='CUDAGraphBlocksHook')]

    * Training runs (``before_train``): training and no-grad calls (the teacher,
      validation) replay graphs, at most ``max_signatures`` per block stack (MLLA:
      per stage): the first ones stay, further sizes run eagerly (a training
      capture holds a step's activations; multi-scale training would replace one
      nearly every step). With ``train=False`` only the no-grad calls do, within the test
      bounds below (for pipelines whose training sizes vary too much to keep a
      training capture, each a step's activations, per size).
    * Runs that only test or validate (``tools/test.py``: ``before_test``;
      ``runner.val()``: ``before_val``), with the model on CUDA: the no-grad
      forward replays graphs, at most ``test_max_signatures`` per stack, each
      captured on its ``test_capture_after``-th call. A dense pipeline's inputs
      vary in size (a detector's padded whole images): the common sizes get graphs,
      sizes seen once run eagerly instead of paying a capture (a few eager passes),
      and a new size beyond the bound frees the least recently used graph and its
      memory pool (an inference graph holds about one forward's temporaries). A
      model on the CPU is left as it is.

    To turn it off for one run of a config whose only custom hook it is (the dense
    configs, the linear-probe and robustness configs)::

        --cfg-options custom_hooks=[]

    and where the list holds other hooks (the MLLA classification configs: the EMA
    hook first; the DINO configs), by its index:
    ``--cfg-options custom_hooks.1.test=False`` (testing) or ``...train=False``.

    Args:
        max_signatures (int): captures kept per block stack in training runs
            (training captures hold their activations: dense pipelines whose
            training inputs vary in size keep it small). Defaults to 8.
        test_max_signatures (int): captures kept per block stack in runs that only
            test or validate, least recently used first out. Defaults to 16: a
            whole-image test (COCO at batch 1, padded to multiples of 32) makes many
            sizes, the common ones recur; a sliding-window test (mmseg's ``slide``)
            makes one.
        test_capture_after (int): calls of a size before it is captured in those
            runs. Defaults to 2.
        train (bool): whether training calls replay graphs in training runs.
            Defaults to True.
        test (bool): whether runs that only test or validate replay graphs.
            Defaults to True.

    An eager DinoVim step is bound by the host's Python (a few dozen launches per
    block, 24 blocks); replayed, each backbone pass is one launch. The kernels and
    the numbers are eager's, nothing compiles, and each capture takes about a
    second (:mod:`mmdinomamba.engine.graphed_blocks`). On a CPU the blocks run
    eagerly. The shipped DinoVim DINO configs, the classification, linear-probe and
    robustness configs and the dense configs (UperNet, Cascade and Mask R-CNN) add
    it; a model without such a backbone (ViT) is left as it is, with one logged
    line.
    """
    priority = 'VERY_HIGH'

    def __init__(self, max_signatures: int = 8,
                 test_max_signatures: int = TEST_MAX_SIGNATURES,
                 test_capture_after: int = TEST_CAPTURE_AFTER, train: bool = True,
                 test: bool = True):
        self.max_signatures = _positive_int('max_signatures', max_signatures)
        self.test_max_signatures = _positive_int('test_max_signatures',
                                                 test_max_signatures)
        self.test_capture_after = _positive_int('test_capture_after',
                                                test_capture_after)
        for name, value in (('train', train), ('test', test)):
            if not isinstance(value, bool):
                raise ValueError(f'CUDAGraphBlocksHook: {name} must be True or False, '
                                 f'got {value!r}')
        self.train, self.test = train, test

    def _test_bounds(self) -> dict:
        return dict(training=False, max_signatures=self.test_max_signatures,
                    capture_after=self.test_capture_after)

    def _set(self, runner, model, kwargs: dict, what: str) -> None:
        names = [n or type(model).__name__ for n in graph_blocks(model, **kwargs)]
        if not names:
            runner.logger.info(
                f'CUDAGraphBlocksHook: no module of the model ({type(model).__name__}) '
                'offers a stack or stage runner (`stack_runner`, as DinoVim does, or '
                '`stage_runner`, as MLLA does), so nothing '
                'replays from CUDA graphs; everything runs eagerly')
            return
        runner.logger.info(f'CUDAGraphBlocksHook: {what} replayed from CUDA graphs in '
                           f'{", ".join(f"`{n}`" for n in names)}')

    def before_train(self, runner) -> None:
        model = unwrap_model(runner.model)
        if self.train:
            self._set(runner, model, dict(max_signatures=self.max_signatures),
                      'blocks')
        else:
            self._set(runner, model, self._test_bounds(), 'no-grad blocks')

    def _before_inference(self, runner) -> None:
        model = unwrap_model(runner.model)
        if not self.test or graphed_modules(model) or not on_cuda(model):
            return  # set by before_train already, or nothing to replay on a CPU
        self._set(runner, model, self._test_bounds(), 'no-grad blocks')

    def before_val(self, runner) -> None:
        self._before_inference(runner)

    def before_test(self, runner) -> None:
        self._before_inference(runner)
