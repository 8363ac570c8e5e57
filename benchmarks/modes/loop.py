"""The ``loop`` mode: ``tools/train.py`` as users run it, with the shipped
classification or DINO configs on synthetic ImageNet-layout JPEGs, one process
per model: s/iter, images/s and peak memory from mmengine's log.
"""
from __future__ import annotations

import os
import os.path as osp
import re
import statistics
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..common import _fmt, environment, model_name, partial_writer, write_result
from ..names import BASELINE, CLS_CONFIGS, COMPILED, CONFIG_DIR, DINO_CONFIGS, REPO, TASKS

# what CompileModulesHook compiles, per task: the backbones
COMPILE_MODULES = dict(cls=['backbone'], dino=['backbone', 'teacher.backbone'])
MAKE_DATA = osp.join(REPO, 'benchmarks', 'make_synthetic_imagenet.py')
TRAIN = osp.join(REPO, 'tools', 'train.py')
# tools/train.py's mixed-precision flags per --amp
LOOP_AMP_FLAGS = {None: [], 'bf16': ['--amp', '--amp-dtype', 'bfloat16'],
                  'fp16': ['--amp']}


def task_configs(task: str, config_dir: str = CONFIG_DIR) -> Dict[str, str]:
    """The loop's configs by model name: ``'dino'`` the shipped DINO pretraining
    configs (files of ``config_dir``), ``'cls'`` the ImageNet classification
    configs (:data:`benchmarks.names.CLS_CONFIGS`)."""
    if task == 'dino':
        return {name: osp.join(config_dir, f) for name, f in DINO_CONFIGS.items()}
    if task == 'cls':
        return dict(CLS_CONFIGS)
    raise ValueError(f'benchmark loop: task must be one of {TASKS}, got {task!r}')


def load_named_config(path: str):
    """A config from a file, or ``pkg::path`` from an installed OpenMMLab
    package's own configs (as ``_base_`` reads them)."""
    from mmengine.config import Config
    if '::' in path:
        from mmengine.hub import get_config
        return get_config(path)
    return Config.fromfile(path)


def loop_config(config: str, task: str, root: str, iters: int,
                batch: Optional[int] = None, size: Optional[int] = None,
                workers: int = 14, log_interval: int = 10,
                compile_mode: Optional[str] = None):
    """The config a timed run trains with: ``config`` as shipped, on the
    synthetic data of ``root``, for one epoch of exactly ``iters`` iterations.

    Changed: the data root, the first ``batch * iters`` images
    (``dataset.indices``), ``batch`` (None keeps the config's), the loader's
    workers, one epoch, the logging interval, no checkpoints; parameter
    schedulers that begin after the first epoch are dropped (they never act in a
    one-epoch run, and mmengine refuses a scheduler that begins after the run's
    end). ``size`` (classification only): the training crop
    (``RandomResizedCrop``) and the backbone's nominal ``img_size``.
    ``compile_mode``: the task's backbones compiled by
    :class:`~mmdinomamba.engine.hooks.CompileModulesHook` (``dynamic=False``), as
    the DINO ``-compile`` configs do.

    Returns:
        tuple: (the config, images per iteration).
    """
    if iters < 1:
        raise ValueError(f'benchmark loop: iters must be >= 1, got {iters}')
    cfg = load_named_config(config)
    loader = cfg.train_dataloader
    batch = batch or loader.batch_size
    loader.batch_size = batch
    loader.num_workers = workers
    loader.persistent_workers = workers > 0
    loader.dataset.data_root = root
    loader.dataset.indices = batch * iters
    cfg.train_cfg.max_epochs = 1
    schedulers = cfg.get('param_scheduler') or []
    schedulers = [schedulers] if isinstance(schedulers, dict) else schedulers
    cfg.param_scheduler = [
        s for s in schedulers
        if s.get('begin', 0) < (1 if s.get('by_epoch', True) else iters)]
    cfg.default_hooks.logger.interval = log_interval
    cfg.default_hooks.checkpoint.interval = iters + 1
    cfg.default_hooks.checkpoint.save_last = False
    if size is not None:
        if task != 'cls':
            raise ValueError('benchmark loop: --size sets a classification crop; the '
                             "DINO configs' crops are their own (leave --size out)")
        crops = [t for t in loader.dataset.pipeline if t['type'] == 'RandomResizedCrop']
        if len(crops) != 1:
            raise ValueError(f'benchmark loop: --size needs one RandomResizedCrop in '
                             f"{config}'s training pipeline, found {len(crops)}")
        crops[0]['scale'] = size
        if 'img_size' in cfg.model.backbone:
            cfg.model.backbone.img_size = size
    if compile_mode:
        cfg.custom_hooks = list(cfg.get('custom_hooks') or []) + [
            dict(type='CompileModulesHook', modules=COMPILE_MODULES[task],
                 mode=compile_mode, dynamic=False)]
    return cfg, batch


def read_train_log(text: str) -> Dict[str, object]:
    """Seconds per iteration, data time and peak memory from mmengine's log.

    mmengine logs, every ``interval`` iterations, the mean ``time`` and
    ``data_time`` over the window and (CUDA) ``memory``, the peak allocated MiB
    since the last log. The first window holds the warm-up (and any
    compilation); s/iter is the mean of the others, the peak the highest of all.

    Returns:
        dict: ``s_iter``, ``data_time`` (means over the windows after the first),
        ``windows`` (every window's time), ``peak_gib`` (None without CUDA); or
        ``error`` when fewer than two windows were logged.
    """
    times = [float(t) for t in re.findall(r'\btime: ([0-9.]+)', text)]
    data = [float(t) for t in re.findall(r'\bdata_time: ([0-9.]+)', text)]
    memory = [int(m) for m in re.findall(r'\bmemory: ([0-9]+)', text)]
    if len(times) < 2:
        return dict(windows=times, error=f'{len(times)} logged window(s): s/iter '
                    'needs two (the first holds the warm-up)')
    return dict(s_iter=statistics.mean(times[1:]), windows=times,
                data_time=statistics.mean(data[1:]) if len(data) > 1 else None,
                peak_gib=max(memory) / 1024 if memory else None)


def synthetic_images(root: str, num_images: int) -> None:
    """At least ``num_images`` synthetic JPEGs under ``root`` (written by
    ``make_synthetic_imagenet.py`` unless its list already holds that many)."""
    listing = osp.join(root, 'meta', 'train.txt')
    if osp.isfile(listing):
        with open(listing) as f:
            if sum(1 for line in f if line.strip()) >= num_images:
                return
    subprocess.run([sys.executable, MAKE_DATA, root, str(num_images)], check=True)


def run_loop(names: Sequence[str], task: str, root: str, work_dir: str, iters: int,
             batch: Optional[int] = None, size: Optional[int] = None,
             workers: int = 14, log_interval: int = 10,
             compile_mode: str = 'default', amp: Optional[str] = None,
             baseline: Optional[str] = BASELINE, config_dir: str = CONFIG_DIR,
             on_row: Optional[Callable[[List[dict]], None]] = None) -> List[dict]:
    """Train each named model with ``tools/train.py`` for ``iters`` iterations,
    one process each, and read its log (:func:`read_train_log`).

    A name (of :func:`task_configs`) ending in ``+compile`` trains compiled
    (:func:`loop_config`'s ``compile_mode``). Each run's config is written to
    ``work_dir/<name>.py``, its output to ``work_dir/<name>.log``. ``amp``: None
    trains in the config's own precision, 'bf16' / 'fp16' add ``tools/train.py
    --amp`` (bf16: ``--amp-dtype bfloat16``). ``img_s_vs_baseline`` is the row's
    images/s over the baseline's: the baseline model with the row's ``+compile``
    if that ran, else the eager one; ``baseline`` (if not None) is measured first
    unless ``names`` name it (eager or compiled).

    Returns:
        list[dict]: per name, ``model``, ``config``, ``batch``, ``compile``,
        ``s_iter``, ``img_s``, ``data_time``, ``peak_gib``, ``windows``, ``log``
        (or ``error``) and the ratio.
    """
    if amp not in LOOP_AMP_FLAGS:
        raise ValueError(f'benchmark loop: amp must be one of {list(LOOP_AMP_FLAGS)}, '
                         f'got {amp!r}')
    if iters < 2 * log_interval:
        raise ValueError(f'benchmark loop: {iters} iterations give fewer than two '
                         f'logged windows of {log_interval}; s/iter needs two (the '
                         'first holds the warm-up)')
    configs = task_configs(task, config_dir)
    work_dir = osp.abspath(work_dir)
    names = [model_name(n[:-len(COMPILED)]) + COMPILED if n.endswith(COMPILED)
             else model_name(n) for n in names]
    if baseline is not None and not {baseline, baseline + COMPILED} & set(names):
        names = [baseline] + names
    unknown = sorted({n[:-len(COMPILED)] if n.endswith(COMPILED) else n
                      for n in names} - set(configs))
    if unknown:
        raise ValueError(f'benchmark loop: no {task} config for {unknown}; choose '
                         f'from {sorted(configs)} (a name may end in {COMPILED!r})')
    os.makedirs(work_dir, exist_ok=True)
    runs = []
    for name in names:
        compiled = name.endswith(COMPILED)
        config = configs[name[:-len(COMPILED)] if compiled else name]
        cfg, images = loop_config(config, task, osp.abspath(root), iters, batch, size,
                                  workers, log_interval,
                                  compile_mode if compiled else None)
        path = osp.join(work_dir, name.replace('+', '_') + '.py')
        cfg.dump(path)
        runs.append(dict(model=name, config=config, run_config=path, batch=images,
                         compile=compile_mode if compiled else None, task=task))
    synthetic_images(root, max(r['batch'] for r in runs) * iters)
    rows = []
    for row in runs:
        row['log'] = osp.join(work_dir, row['model'].replace('+', '_') + '.log')
        cmd = [sys.executable, TRAIN, row['run_config'], '--work-dir',
               osp.join(work_dir, row['model'].replace('+', '_')), '--no-validate',
               *LOOP_AMP_FLAGS[amp]]
        row['command'] = ' '.join(cmd)
        with open(row['log'], 'w') as log:
            done = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        with open(row['log']) as log:
            text = log.read()
        row.update(read_train_log(text))
        if done.returncode:
            raised = re.findall(r'^(\w+(?:Error|Exception)\b.*)$', text, re.M)
            row['error'] = (f'tools/train.py exited with {done.returncode}'
                            + (f' ({raised[-1][:200]})' if raised else '')
                            + f"; see {row['log']}")
        if 'error' not in row:
            row['img_s'] = row['batch'] / row['s_iter']
        rows.append(row)
        print(format_loop_row(row), flush=True)
        if on_row is not None:
            on_row(rows)
    add_loop_ratios(rows, baseline)
    return rows


def add_loop_ratios(rows: List[dict], baseline: Optional[str]) -> None:
    """``img_s_vs_baseline`` and ``baseline`` (the row it refers to) for each row:
    the baseline with the row's ``+compile`` where it ran, else the eager one."""
    if baseline is None:
        return
    by_name = {r['model']: r for r in rows if r.get('img_s')}
    for r in rows:
        suffix = COMPILED if r['model'].endswith(COMPILED) else ''
        base = by_name.get(baseline + suffix) or by_name.get(baseline)
        if base is not None and r.get('img_s'):
            r['baseline'] = base['model']
            r['img_s_vs_baseline'] = r['img_s'] / base['img_s']


def format_loop_row(r: dict) -> str:
    if 'error' in r:
        return f"{r['model']:<24}  ERROR {r['error']}"
    return (f"{r['model']:<24} {r['batch']:>5} {r['s_iter']:8.3f} {r['img_s']:9.1f} "
            f"{_fmt(r.get('img_s_vs_baseline'), '6.2f'):>6} "
            f"{_fmt(r.get('peak_gib'), '8.2f'):>8} {_fmt(r.get('data_time'), '9.4f'):>9}"
            f"  {r.get('baseline', '-')}")


def format_loop_table(rows: List[dict]) -> str:
    head = (f"{'model':<24} {'batch':>5} {'s/iter':>8} {'img/s':>9} {'xBase':>6} "
            f"{'peakGiB':>8} {'dataTime':>9}  baseline")
    return '\n'.join([head, '-' * len(head)] + [format_loop_row(r) for r in rows])


def run(args) -> dict:
    """The mode's part of the command line (its own: one process per model)."""
    if args.amp == 'none':
        raise ValueError('benchmark loop: --amp none cannot take AMP out of a config; '
                         "leave --amp out for the config's own precision")
    configs = task_configs(args.task, args.config_dir)
    names = args.models or [n for n in configs if n != BASELINE]
    result = dict(mode='loop', environment=environment(torch.device(args.device)),
                  settings=dict(task=args.task, models=names, amp=args.amp,
                                train_iters=args.train_iters, batch=args.batch,
                                size=args.size, workers=args.workers,
                                log_interval=args.log_interval,
                                compile_mode=args.compile_mode),
                  command=' '.join(sys.argv))
    rows = run_loop(names, args.task, args.root, args.work_dir, args.train_iters,
                    args.batch, args.size, args.workers, args.log_interval,
                    args.compile_mode, args.amp,
                    None if args.no_baseline else BASELINE, args.config_dir,
                    on_row=partial_writer(result, args.out))
    result['rows'] = rows
    print(format_loop_table(rows))
    if args.out:
        write_result(result, args.out)
    return result
