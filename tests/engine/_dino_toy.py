"""Shared by the DINO training tests: a tiny version of the toy DINO config and a
hook that stops a run early (their toy data: ``toy_root`` in conftest.py)."""
import os.path as osp

from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOY_CONFIG = osp.join(ROOT, 'configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py')


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
    cfg.train_dataloader.dataset.pipeline[1].update(global_size=32, local_size=16,
                                                    num_local_views=2)
    cfg.train_dataloader.update(batch_size=4, num_workers=num_workers,
                                persistent_workers=False)
    cfg.train_dataloader.dataset.data_root = data_root
    cfg.train_cfg.max_epochs = max_epochs
    schedulers = []
    for sched in cfg.param_scheduler:
        sched.end = min(sched.end, max_epochs)
        if sched.end <= sched.begin:
            continue  # e.g. the cosine after a one-epoch warm-up in a one-epoch run
        if 'T_max' in sched:
            sched.T_max = sched.end - sched.begin
        schedulers.append(sched)
    cfg.param_scheduler = schedulers
    # the paper's one frozen epoch for the prototypes (the toy config freezes
    # them for its whole run), so that a 2-epoch run has both phases
    freeze, = [h for h in cfg.custom_hooks if h.type == 'DINOFreezeLastLayerHook']
    freeze.freeze_epochs = 1
    cfg.default_hooks.checkpoint.update(interval=1, max_keep_ckpts=3)
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
