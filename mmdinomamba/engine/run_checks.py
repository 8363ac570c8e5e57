"""Checks that turn a run's silent or cryptic failures into errors that name the fix.

``tools/train.py`` and ``tools/test.py`` call them around ``Runner.from_cfg``:

- :func:`check_config_keys`: a top-level key the Runner does not read but that
  looks like one it does (``randomnes``), or a new top-level key from
  ``--cfg-options``, is logged as a warning naming the closest known key;
- :func:`build_checked_loop`: builds the train (or test) loop and fails, naming
  the dataset and the fix, on an empty dataset, on a dataset smaller than one
  batch, and on a classifier head whose class count differs from the data's; and
  it makes every data-pipeline error name the image file it was reading.
"""
import difflib
import logging
from typing import Iterable, List, Optional

import numpy as np
from mmengine.config import Config
from mmengine.logging import print_log

from .hooks.utils import unwrap_model

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


def _labels(dataset) -> set:
    """The distinct integer labels of a classification dataset's samples (empty
    where the samples carry none, e.g. segmentation or a wrapped dataset)."""
    if not hasattr(dataset, 'get_gt_labels'):
        return set()
    try:
        labels = dataset.get_gt_labels()
    except (KeyError, TypeError, ValueError):
        return set()
    return {int(v) for v in np.unique(np.asarray(labels))} if len(labels) else set()


def build_checked_loop(runner, mode: str = 'train'):
    """Build ``runner``'s train or test loop, checking that its data fits.

    Args:
        runner (Runner): a runner from ``Runner.from_cfg``.
        mode (str): 'train' or 'test'. Defaults to 'train'.

    Returns:
        the loop (``runner.train_loop`` or ``runner.test_loop``), which
        ``runner.train()`` / ``runner.test()`` then use.

    Raises:
        ValueError: the dataset is empty; it holds fewer samples than one batch
            (training with ``drop_last``); the model's ``head.num_classes`` (or
            ``decode_head.num_classes``) differs from the dataset's class count and
            from the number of distinct labels its samples carry, or is smaller than
            a label.
    """
    if mode not in ('train', 'test'):
        raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
    where = _describe(runner.cfg, mode)
    try:
        loop = getattr(runner, f'{mode}_loop')
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
    classes = (getattr(dataset, 'metainfo', None) or {}).get('classes')
    model = unwrap_model(runner.model)
    for head_name in ('head', 'decode_head'):
        num = getattr(getattr(model, head_name, None), 'num_classes', None)
        if not (isinstance(num, int) and classes and len(classes) != num):
            continue
        # the head may still fit the labels the data really holds: an ImageNet-type
        # folder of 4 class folders keeps the 1000 ImageNet names
        labels = _labels(dataset)
        if labels and max(labels) >= num:
            raise ValueError(
                f'model.{head_name}.num_classes is {num}, but {where} has labels up '
                f'to {max(labels)}: set --cfg-options model.{head_name}.num_classes='
                f'{max(labels) + 1} (and data_preprocessor.num_classes where the '
                'config sets it)')
        if len(labels) != num:
            found = len(labels) or len(classes)
            raise ValueError(
                f'model.{head_name}.num_classes is {num}, but {where} has '
                f'{len(classes)} classes ({", ".join(map(str, classes[:5]))}'
                f'{", ..." if len(classes) > 5 else ""})'
                + (f' and {len(labels)} distinct labels' if labels else '')
                + f': set --cfg-options model.{head_name}.num_classes={found} (and '
                f'data_preprocessor.num_classes={found} where the config sets it)')
    name_pipeline_errors(dataset)
    return loop
