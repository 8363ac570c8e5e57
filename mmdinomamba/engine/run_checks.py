"""Checks that turn a run's silent or cryptic failures into errors that name the fix.

``tools/train.py`` and ``tools/test.py`` call them around ``Runner.from_cfg``:

- :func:`check_amp_device`: a mixed-precision optimizer wrapper (``--amp``, or
  an ``-amp`` recipe) on a machine without a GPU fails at once, naming the
  float32 twin, before anything is written;
- :func:`check_config_types`: a config value of the wrong type (``lr=abc``,
  ``patch_size='8'``) fails before the Runner starts, naming the key, the type
  wanted and the value given (read from the annotations of the class it is for:
  the optimizer, the parameter schedulers, our models);
- :func:`check_config_keys`: a top-level key the Runner does not read but that
  looks like one it does (``randomnes``), or a new top-level key from
  ``--cfg-options``, is logged as a warning naming the closest known key;
- :func:`build_checked_loop`: builds the train (or test) loop and fails, naming
  the dataset and the fix, on data that is not where the config says, on an
  empty dataset, on a dataset smaller than one batch, and on a classifier head
  whose class count differs from the data's; and it makes every data-pipeline
  error name the image file it was reading.
"""
import difflib
import logging
import os
import os.path as osp
from typing import Iterable, List, Optional

import numpy as np
from mmengine.config import Config
from mmengine.logging import print_log

from mmdinomamba.utils.arg_types import check_arg_types
from .hooks.utils import unwrap_model
from .run_config import AMP_WRAPPERS, amp_twin

# top-level keys mmengine's Runner (and its from_cfg) reads
RUNNER_KEYS = (
    'model', 'work_dir', 'train_dataloader', 'val_dataloader', 'test_dataloader',
    'train_cfg', 'val_cfg', 'test_cfg', 'auto_scale_lr', 'optim_wrapper',
    'param_scheduler', 'val_evaluator', 'test_evaluator', 'default_hooks',
    'custom_hooks', 'data_preprocessor', 'load_from', 'resume', 'launcher', 'env_cfg',
    'log_processor', 'log_level', 'visualizer', 'default_scope', 'randomness',
    'experiment_name', 'model_wrapper_cfg', 'find_unused_parameters', 'compile',
    'activation_checkpointing', 'efficient_conv_bn_eval', 'runner_type',
    'custom_imports', 'strategy')
# how close a config's own key must be to a Runner key to look like its typo
TYPO_CUTOFF = 0.8
# what mmengine's BaseDataset raises when its annotation list is empty
EMPTY_DATASET = 'need at least one array to concatenate'


def check_config_keys(cfg: Config, keys_before: Optional[Iterable[str]] = None
                      ) -> List[str]:
    """Warn about top-level keys that look like typos; the Runner ignores them.

    Args:
        cfg (Config): the config, ``--cfg-options`` merged.
        keys_before (iterable[str], optional): its top-level keys before the
            options were merged; a key that only the options brought is reported
            whatever its name.

    Returns:
        list[str]: the warnings (also logged).
    """
    before = set(keys_before) if keys_before is not None else set(cfg.keys())
    messages = []
    for key in cfg.keys():
        if key in RUNNER_KEYS or key.startswith('_'):
            continue
        if key not in before:
            close = difflib.get_close_matches(key, RUNNER_KEYS + tuple(before), n=1)
            messages.append(f'--cfg-options: {key!r} is a new top-level key that '
                            'nothing reads' +
                            (f'; did you mean {close[0]!r}?' if close else ''))
            continue
        close = difflib.get_close_matches(key, RUNNER_KEYS, n=1, cutoff=TYPO_CUTOFF)
        if close:
            messages.append(f'config key {key!r} is not read by the Runner; did you '
                            f'mean {close[0]!r}?')
    for message in messages:
        print_log(message, logger='current', level=logging.WARNING)
    return messages


def _registered(registry, name, scope: str):
    """The class ``name`` of ``registry`` in ``scope`` (None where not found)."""
    if not isinstance(name, str):
        return name if isinstance(name, type) else None
    try:
        with registry.switch_scope_and_registry(scope) as found:
            return found.get(name)
    except Exception:  # a scope whose package is not installed, a bad name: the
        return None    # Runner names those itself


def _check_dict(cls, cfg: dict, where: str) -> None:
    if cls is not None:
        check_arg_types(cls, {k: v for k, v in cfg.items() if k != 'type'}, where)


def _check_models(node, where: str, scope: str) -> None:
    """Our model classes' dicts under ``node`` (at any depth) against their
    ``__init__``'s annotations; other packages' classes are left to themselves."""
    from mmengine.registry import MODELS
    if isinstance(node, dict):
        cls = _registered(MODELS, node.get('type'), scope) if 'type' in node else None
        if cls is not None and cls.__module__.startswith('mmdinomamba.'):
            _check_dict(cls, node, where + '.')
        for key, value in node.items():
            _check_models(value, f'{where}.{key}', scope)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            _check_models(value, f'{where}[{i}]', scope)


def check_config_types(cfg: Config) -> None:
    """Fail on a config value whose type its class does not take.

    Checked against the annotations of the class each dict builds
    (:func:`mmdinomamba.utils.arg_types.check_arg_types`): the optimizer
    (``optim_wrapper.optimizer``: torch's optimizers annotate ``lr``,
    ``weight_decay``, ``betas``, ...), every parameter scheduler, and every
    model dict of a class of ours (``model.backbone``; the mixers' and backbones'
    own ``__init__`` check their arguments too). The loaders' ``batch_size`` and
    ``num_workers`` must be ints.

    Raises:
        ArgTypeError: (a TypeError and a ValueError) naming the key, the type it
            takes and the value given.
    """
    from mmengine.registry import OPTIMIZERS, PARAM_SCHEDULERS
    scope = cfg.get('default_scope') or 'mmengine'
    wrapper = cfg.get('optim_wrapper') or {}
    optimizer = wrapper.get('optimizer') if isinstance(wrapper, dict) else None
    if isinstance(optimizer, dict) and 'type' in optimizer:
        _check_dict(_registered(OPTIMIZERS, optimizer.type, scope), optimizer,
                    'optim_wrapper.optimizer.')
    schedulers = cfg.get('param_scheduler') or []
    schedulers = [schedulers] if isinstance(schedulers, dict) else schedulers
    for i, s in enumerate(schedulers):
        if isinstance(s, dict) and 'type' in s:
            _check_dict(_registered(PARAM_SCHEDULERS, s.type, scope), s,
                        f'param_scheduler[{i}].')
    for mode in ('train', 'val', 'test'):
        loader = cfg.get(f'{mode}_dataloader')
        if isinstance(loader, dict):
            hints = {k: int for k in ('batch_size', 'num_workers') if k in loader}
            check_arg_types(None, {k: loader[k] for k in hints},
                            f'{mode}_dataloader.', hints=hints)
    if isinstance(cfg.get('model'), dict):
        _check_models(cfg.model, 'model', scope)


def amp_device_available() -> bool:
    """Whether mmengine's ``AmpOptimWrapper`` can run here: CUDA, NPU, MLU or
    MUSA (the devices it asserts)."""
    from mmengine.device import (is_cuda_available, is_mlu_available,
                                 is_musa_available, is_npu_available)
    return (is_cuda_available() or is_npu_available() or is_mlu_available()
            or is_musa_available())


def check_amp_device(cfg: Config, how: str = '') -> None:
    """Fail when ``cfg`` trains in mixed precision on a machine without a GPU.

    mmengine's ``AmpOptimWrapper`` (and our ``PerParamClipAmpOptimWrapper``)
    assert a GPU only when the Runner builds them, after the work dir, its log
    and the dumped config are written.

    Args:
        cfg (Config): the config, options merged.
        how (str): how the run asked for mixed precision (e.g. ``'--amp'``),
            named in the message. Defaults to ''.

    Raises:
        RuntimeError: the optimizer wrapper is a mixed-precision one and no
            CUDA (NPU, MLU, MUSA) device is available; the message names the
            float32 wrapper to use instead.
    """
    wrapper = (cfg.get('optim_wrapper') or {}).get('type')
    if wrapper not in AMP_WRAPPERS.values() and wrapper != 'AmpOptimWrapper':
        return
    if amp_device_available():
        return
    plain = amp_twin(wrapper, amp=False)
    asked = how or f'the config\'s optim_wrapper.type={wrapper!r}'
    fix = f'--cfg-options optim_wrapper.type={plain}' + (f' and without {how}'
                                                         if how else '')
    raise RuntimeError(
        f'{asked} trains in mixed precision, which needs a GPU, and this machine '
        f'has none (torch.cuda.is_available() is False): train in float32 on the '
        f'CPU with {fix}')


class NamedErrorPipeline:
    """A dataset's pipeline whose errors name the file of the sample.

    A pipeline error inside a data worker otherwise shows only the library's
    message (e.g. OpenCV's ``!buf.empty()`` for an empty image file). Errors
    other than ``OSError`` (which names its file already) are raised again as
    ``ValueError`` naming the sample's ``img_path``.

    Args:
        pipeline (callable): the dataset's pipeline.
    """

    def __init__(self, pipeline):
        self.pipeline = pipeline

    def __call__(self, results: dict):
        path = results.get('img_path') if isinstance(results, dict) else None
        try:
            return self.pipeline(results)
        except OSError:
            raise
        except Exception as err:
            if path is None:
                raise
            kind = type(err).__qualname__ if type(err).__module__ == 'builtins' \
                else f'{type(err).__module__}.{type(err).__qualname__}'
            raise ValueError(f'cannot read {path}: {kind}: {" ".join(str(err).split())} '
                             '(an empty or corrupt file? replace it, or remove it from '
                             'the annotation list)') from err

    def __getattr__(self, name: str):
        if name == 'pipeline':  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.pipeline, name)


def name_pipeline_errors(dataset) -> None:
    """Wrap the pipeline of ``dataset`` (and of the datasets it wraps) in
    :class:`NamedErrorPipeline`, once."""
    for inner in getattr(dataset, 'datasets', None) or [getattr(dataset, 'dataset', None)]:
        if inner is not None:
            name_pipeline_errors(inner)
    pipeline = getattr(dataset, 'pipeline', None)
    if pipeline is not None and not isinstance(pipeline, NamedErrorPipeline):
        dataset.pipeline = NamedErrorPipeline(pipeline)


def _describe(cfg: Config, mode: str) -> str:
    dataset = (cfg.get(f'{mode}_dataloader') or {}).get('dataset') or {}
    fields = [f'{k}={dataset[k]!r}' for k in ('type', 'data_root', 'ann_file',
                                              'data_prefix', 'split') if k in dataset]
    return f'{mode}_dataloader.dataset ({", ".join(fields)})'


def _label_array(dataset) -> Optional[np.ndarray]:
    """Every sample's integer label, in order (None where the samples carry none):
    mmpretrain's ``get_gt_labels``, or each sample's ``gt_label`` (an annotation
    list of :class:`~mmdinomamba.datasets.ImageFolder`)."""
    try:
        if hasattr(dataset, 'get_gt_labels'):
            labels = np.asarray(dataset.get_gt_labels())
        elif hasattr(dataset, 'get_data_info') and len(dataset) \
                and 'gt_label' in dataset.get_data_info(0):
            labels = np.asarray([dataset.get_data_info(i)['gt_label']
                                 for i in range(len(dataset))])
        else:
            return None
    except (KeyError, TypeError, ValueError):
        return None
    return labels.astype(np.int64) if labels.ndim == 1 and len(labels) else None


def check_labels(model, dataset, where: str) -> None:
    """Fail when a classifier's head cannot score ``dataset``'s labels.

    Every label must lie in ``0 .. num_classes - 1`` of the model's ``head``
    (or ``decode_head``); otherwise training stops mid-epoch on a raw
    ``IndexError`` and evaluation silently scores the sample as wrong. A head
    with more classes than the dataset lists (an ImageNet head on the 4-class
    toy data) is refused too; one with fewer, whose labels all fit, trains (an
    ImageNet-type folder of 4 class folders keeps mmpretrain's 1000 names).

    Args:
        model (nn.Module): the model (unwrapped).
        dataset: the loader's dataset.
        where (str): the dataset, for the message.

    Raises:
        ValueError: a label outside the head's classes (the samples counted, the
            first one named, the fix), or a class count the data cannot fill.
    """
    classes = (getattr(dataset, 'metainfo', None) or {}).get('classes') or ()
    for head_name in ('head', 'decode_head'):
        num = getattr(getattr(model, head_name, None), 'num_classes', None)
        if not isinstance(num, int) or isinstance(num, bool):
            continue
        labels = _label_array(dataset)
        if labels is not None:
            bad = np.nonzero((labels < 0) | (labels >= num))[0]
            if len(bad):
                raise _label_error(dataset, where, head_name, num, labels, bad,
                                   len(classes))
            if num <= len(classes) or not classes:
                continue
        elif not classes or len(classes) == num:
            continue
        found = len(classes)
        raise ValueError(
            f'model.{head_name}.num_classes is {num}, but {where} has '
            f'{found} classes ({", ".join(map(str, classes[:5]))}'
            f'{", ..." if found > 5 else ""}): set --cfg-options '
            f'model.{head_name}.num_classes={found} (and '
            f'data_preprocessor.num_classes={found} where the config sets it)')


def fit_topk(evaluator, model) -> List[str]:
    """Clamp the ``topk`` of every accuracy metric of ``evaluator`` to the
    classifier's class count (in place), logging one line per metric changed.

    mmpretrain's ``Accuracy(topk=(1, 5))`` fails on a 4-class head (top-5 of 4
    scores); ``topk=(1, 5)`` on 4 classes becomes ``(1, 4)``.

    Returns:
        list[str]: the logged lines.
    """
    num = getattr(getattr(model, 'head', None), 'num_classes', None)
    if not isinstance(num, int) or isinstance(num, bool) or num < 1:
        return []
    messages = []
    for metric in getattr(evaluator, 'metrics', None) or []:
        topk = getattr(metric, 'topk', None)
        if not isinstance(topk, (tuple, list)) or max(topk) <= num:
            continue
        fitted = tuple(sorted({min(k, num) for k in topk}))
        messages.append(f'{type(metric).__name__}: topk={tuple(topk)} on a '
                        f'{num}-class head; measuring topk={fitted} (set the '
                        "evaluator's topk to choose)")
        metric.topk = fitted
    for message in messages:
        print_log(message, logger='current', level=logging.WARNING)
    return messages


def _label_error(dataset, where: str, head_name: str, num: int, labels: np.ndarray,
                 bad: np.ndarray, num_listed: int) -> ValueError:
    first = int(bad[0])
    try:
        sample = dataset.get_data_info(first).get('img_path') or f'sample {first}'
    except Exception:
        sample = f'sample {first}'
    values = sorted({int(v) for v in labels[bad]})
    shown = ', '.join(map(str, values[:5])) + (', ...' if len(values) > 5 else '')
    head = (f'model.{head_name}.num_classes is {num}, but {where} has labels up to '
            f'{int(labels.max())}' if labels.min() >= 0 else
            f'model.{head_name}.num_classes is {num}, but {where} has negative labels')
    which = (f'{len(bad)} of {len(labels)} samples have labels outside 0..{num - 1} '
             f'({shown}); the first is {sample}')
    if labels.min() < 0 or (num_listed and labels.max() >= num_listed):
        fix = (f'correct the annotation list (ann_file): its labels must be class '
               f'indices 0..{max(num_listed, num) - 1}' +
               (f' of the {num_listed} classes the dataset lists' if num_listed else ''))
        if labels.min() >= 0:
            fix += (f', or set --cfg-options model.{head_name}.num_classes='
                    f'{int(labels.max()) + 1} and the classes')
    else:
        right = int(labels.max()) + 1
        fix = (f'set --cfg-options model.{head_name}.num_classes={right} (and '
               f'data_preprocessor.num_classes={right} where the config sets it)')
    return ValueError(f'{head}: {fix}. {which}')


def missing_data_error(cfg: Config, mode: str, err: OSError) -> FileNotFoundError:
    """The error for data that is not where the config says: the dataset, the
    missing path (and the folder relative paths are read from) and the two fixes,
    pointing the config at the data or making the toy data."""
    dataset = (cfg.get(f'{mode}_dataloader') or {}).get('dataset') or {}
    root = str(dataset.get('data_root') or '')
    missing = err.filename or root
    fixes = [f'point the config at the data: --cfg-options '
             f'{mode}_dataloader.dataset.data_root=PATH (the ADE20K and COCO configs '
             'also read the environment variable DATA_ROOT)']
    if 'toy' in osp.basename(root.rstrip('/')):
        fixes.append(f'or make the toy data: python tools/make_toy_data.py {root} '
                     "(the arguments are in the config's header; the comparison's "
                     'data is made by tools/run_comparison.py)')
    return FileNotFoundError(
        f'{_describe(cfg, mode)}: {missing!r} does not exist (relative paths are '
        f'read from {os.getcwd()}); ' + ', '.join(fixes))


def build_checked_loop(runner, mode: str = 'train'):
    """Build ``runner``'s train or test loop, checking that its data fits.

    Args:
        runner (Runner): a runner from ``Runner.from_cfg``.
        mode (str): 'train' or 'test'. Defaults to 'train'.

    Returns:
        the loop (``runner.train_loop`` or ``runner.test_loop``), which
        ``runner.train()`` / ``runner.test()`` then use.

    Raises:
        FileNotFoundError: the data is not where the config says (named, with
            the fixes).
        ValueError: the dataset is empty; it holds fewer samples than one batch
            (training with ``drop_last``); a label of its samples (or, training,
            of the validation samples) lies outside the model's ``head`` (or
            ``decode_head``) classes, or the head has more classes than the
            dataset lists (:func:`check_labels`).
    """
    if mode not in ('train', 'test'):
        raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
    where = _describe(runner.cfg, mode)
    try:
        loop = getattr(runner, f'{mode}_loop')
    except FileNotFoundError as err:
        raise missing_data_error(runner.cfg, mode, err) from err
    except ValueError as err:
        if EMPTY_DATASET not in str(err):
            raise
        raise ValueError(
            f'{where} holds no samples (an empty annotation list or image folder): '
            'point it at the data (data_root, ann_file, data_prefix), or make the toy '
            'data with `python tools/make_toy_data.py data/toy`') from err
    loader = loop.dataloader
    dataset = loader.dataset
    if len(loader) == 0:
        per_process = len(loader.sampler) if hasattr(loader.sampler, '__len__') \
            else len(dataset)
        raise ValueError(
            f'{where} gives no batch: {len(dataset)} samples ({per_process} per '
            f'process) are fewer than one batch of {loader.batch_size}, and '
            'incomplete batches are dropped (drop_last=True). Add data, or lower '
            f'the batch size: --cfg-options {mode}_dataloader.batch_size='
            f'{max(per_process, 1)}')
    model = unwrap_model(runner.model)
    check_labels(model, dataset, where)
    if mode == 'test':
        fit_topk(loop.evaluator, model)
    elif runner.cfg.get('val_dataloader') and runner.cfg.get('val_cfg') is not None:
        # the validation data too, before the first epoch rather than after it
        try:
            val_loop = runner.val_loop
        except FileNotFoundError as err:
            raise missing_data_error(runner.cfg, 'val', err) from err
        check_labels(model, val_loop.dataloader.dataset, _describe(runner.cfg, 'val'))
        fit_topk(val_loop.evaluator, model)
    name_pipeline_errors(dataset)
    return loop
