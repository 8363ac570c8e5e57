"""Run by torchrun in test_resume.py: one of an uninterrupted, an interrupted and a
resumed DDP run.

The tiny toy DINO (2 epochs) on two processes: ``full`` uninterrupted, ``half``
stopped after epoch 1 (its schedule still 2 epochs), and ``resumed`` from
``half/epoch_1.pth``. Each run is its own torchrun, as a user's interrupted and
resumed ``tools/dist_train.sh`` runs are (one run per process group; three runs in
one pair of processes once aborted a rank as an earlier run's objects were freed).
Each rank draws its own drop-path masks and crops (``diff_rank_seed``,
augmentation in the main process), so a rank restoring another rank's states would
show.

Usage: torchrun --nproc_per_node=2 _dino_ddp_resume_worker.py DATA_ROOT WORK_DIR RUN
(RUN: full, half or resumed)
"""
import os.path as osp
import sys

from mmengine.hooks import Hook
from mmengine.runner import Runner

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from _dino_toy import tiny_dino_config  # noqa: E402

from mmdinomamba.engine import (allow_mmengine_checkpoint_types,  # noqa: E402
                                setup_cpu_distributed, teardown_distributed)



class StopAfterFirstEpoch(Hook):

    def after_train_epoch(self, runner):
        runner.train_loop.stop_training = True


def run(data_root, work_dir, name, resume_from=None, hooks=()):
    # augmentation in the main process: it draws from each rank's own generators
    cfg = tiny_dino_config(data_root, osp.join(work_dir, name), max_epochs=2,
                           num_workers=0)
    cfg.launcher = 'pytorch'
    cfg.experiment_name = name
    cfg.randomness = dict(seed=0, diff_rank_seed=True)
    if resume_from is not None:
        cfg.resume, cfg.load_from = True, resume_from
    setup_cpu_distributed(cfg)
    runner = Runner.from_cfg(cfg)
    for hook in hooks:
        runner.register_hook(hook)
    runner.train()


def main():
    data_root, work_dir, name = sys.argv[1:4]
    allow_mmengine_checkpoint_types()
    if name == 'full':
        run(data_root, work_dir, 'full')
    elif name == 'half':
        run(data_root, work_dir, 'half', hooks=[StopAfterFirstEpoch()])
    elif name == 'resumed':
        run(data_root, work_dir, 'resumed',
            resume_from=osp.join(work_dir, 'half', 'epoch_1.pth'))
    else:
        raise SystemExit(f'unknown run {name!r}: full, half or resumed')
    teardown_distributed()


if __name__ == '__main__':
    main()
