"""Shared by the DINO training tests: a tiny version of the toy DINO config, a
hook that stops a run early, and ``tools/train.py`` as a process, sound or dying
on purpose (their toy data: ``toy_root`` in tests/conftest.py)."""
import os
import os.path as osp
import subprocess
import sys

from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmdinomamba.engine import set_run_length

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOY_CONFIG = osp.join(ROOT, 'configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py')
PROBE_CONFIG = osp.join(ROOT,
                        'configs/linear_probe/dinovim-toy-p8_1xb16-linear-10e_toy.py')
# a training process: the checkout's package, one thread
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
           OMP_NUM_THREADS='1')


def tiny_dino_config(data_root: str, work_dir: str, max_epochs: int = 2,
                     num_workers: int = 1) -> Config:
    """The toy config with a 2-block, 32-wide DinoVim, 32/16 px crops, 4 images a
    batch, and the prototypes frozen for the first epoch only.

    Drop-path stays on (rate 0.1) and the augmentations are the config's own: a
    resumed run repeats an uninterrupted one only because the checkpoint hook
    restores the RNG states. With ``num_workers=0`` the augmentations draw from
    the main process's generators; with workers (not persistent) mmengine
    re-seeds them every epoch.
    """
    cfg = Config.fromfile(TOY_CONFIG)
    cfg.work_dir = work_dir
    cfg.model.backbone.update(arch=dict(embed_dims=32, num_layers=2), img_size=32)
    cfg.model.head.update(in_channels=32, out_channels=64, hidden_channels=64,
                          bottleneck_channels=16)
    cfg.model.loss.out_channels = 64
    crop, = [t for t in cfg.train_dataloader.dataset.pipeline
             if t.type == 'DINOMultiCrop']
    crop.update(global_size=32, local_size=16, num_local_views=2)
    cfg.train_dataloader.update(batch_size=4, num_workers=num_workers,
                                persistent_workers=False)
    cfg.train_dataloader.dataset.data_root = data_root
    # one warm-up epoch, none in a one-epoch run
    set_run_length(cfg, max_epochs, warmup_epochs=min(1, max_epochs - 1))
    # the paper's one frozen epoch for the prototypes (the toy config freezes
    # them for its whole run), so that a 2-epoch run has both phases
    freeze, = [h for h in cfg.custom_hooks if h.type == 'DINOFreezeLastLayerHook']
    freeze.freeze_epochs = 1
    cfg.default_hooks.checkpoint.update(interval=1, max_keep_ckpts=3)
    cfg.default_hooks.logger.interval = 1
    cfg.log_level = 'WARNING'
    return cfg


def tiny_probe_config(data_root: str, work_dir: str, max_epochs: int = 3,
                      max_iters: int = None) -> Config:
    """The toy linear probe, from scratch, on the 2-class toy data: 4 images a
    batch (4 iterations an epoch), augmentation in the main process
    (``num_workers=0``), validated and checkpointed every epoch with the best
    top-1 kept. Its validation flips at random, so that a validation draws from
    the generators a training run continues with.

    With ``max_iters``: an iteration-based run of that many iterations, with an
    infinite sampler, validated and checkpointed every 2 iterations.
    """
    cfg = Config.fromfile(PROBE_CONFIG)
    cfg.work_dir = work_dir
    cfg.model.head.num_classes = cfg.data_preprocessor.num_classes = 2
    cfg.model.backbone.init_cfg = None
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.update(data_root=data_root,
                                   classes=osp.join(data_root, 'classes.txt'))
        cfg[loader].update(num_workers=0, persistent_workers=False, batch_size=4)
    pipeline = cfg.val_dataloader.dataset.pipeline
    pipeline.insert(-1, dict(type='RandomFlip', prob=0.5, direction='horizontal'))
    cfg.train_cfg.update(max_epochs=max_epochs, val_interval=1)
    cfg.default_hooks.checkpoint.update(interval=1, max_keep_ckpts=3,
                                        save_best='accuracy/top1')
    if max_iters is not None:
        cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters,
                             val_interval=2)
        cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
        cfg.param_scheduler = dict(type='CosineAnnealingLR', by_epoch=False, begin=0,
                                   end=max_iters)
        cfg.default_hooks.checkpoint.update(by_epoch=False, interval=2)
        cfg.log_processor = dict(by_epoch=False)
        cfg.default_hooks.logger.log_metric_by_epoch = False  # logged at iterations
    cfg.default_hooks.logger.interval = 1
    cfg.log_level = 'WARNING'
    return cfg


class StopAfter(Hook):
    """Stop an epoch-based run after ``epochs`` epochs (its schedule stays as
    configured, as in a run that was interrupted)."""

    def __init__(self, epochs):
        self.epochs = epochs

    def after_train_epoch(self, runner):
        if runner.epoch + 1 >= self.epochs:
            runner.train_loop.stop_training = True


class StopAfterIters(Hook):
    """Stop an iteration-based run after ``iters`` iterations (as
    :class:`StopAfter` does an epoch-based one)."""

    def __init__(self, iters):
        self.iters = iters

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 >= self.iters:
            runner.train_loop.stop_training = True


def train(cfg: Config, name: str, hooks=(), resume_from=None) -> Runner:
    """Build a Runner from ``cfg`` (as ``name``, so that several runs in one process
    keep their own loggers), register ``hooks``, resume from ``resume_from`` if
    given, and train."""
    cfg.experiment_name = name  # distinct loggers / message hubs in one process
    if resume_from is not None:
        cfg.resume, cfg.load_from = True, resume_from
    runner = Runner.from_cfg(cfg)
    for hook in hooks:
        runner.register_hook(hook)
    runner.train()
    return runner


def train_process(*args, fault=None) -> subprocess.CompletedProcess:
    """``tools/train.py ARGS`` in a process from the repository root; with
    ``fault=(FAULT, N)``, run by :mod:`tests.helpers.faulty_train`, which makes
    the process die at a chosen point."""
    prefix = ['-m', 'tests.helpers.faulty_train', *fault, '--'] if fault else \
        [osp.join(ROOT, 'tools/train.py')]
    return subprocess.run([sys.executable, *prefix, *args], env=ENV, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
