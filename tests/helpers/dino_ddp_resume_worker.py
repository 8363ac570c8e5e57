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

Usage (from the repository root): torchrun --nproc_per_node=2 -m
tests.helpers.dino_ddp_resume_worker DATA_ROOT WORK_DIR RUN
(RUN: full, half or resumed)
"""
import os.path as osp
import sys

from tests.helpers.toy_training import StopAfter, tiny_dino_config, train

from mmdinomamba.engine import setup_cpu_distributed, teardown_distributed
from mmdinomamba.utils import allow_mmengine_checkpoint_types


def main():
    data_root, work_dir, name = sys.argv[1:4]
    # the hooks and the checkpoint each run starts from
    runs = {'full': ((), None),
            'half': ((StopAfter(1), ), None),
            'resumed': ((), osp.join(work_dir, 'half', 'epoch_1.pth'))}
    if name not in runs:
        raise SystemExit(f'unknown run {name!r}: full, half or resumed')
    hooks, resume_from = runs[name]
    allow_mmengine_checkpoint_types()
    # augmentation in the main process: it draws from each rank's own generators
    cfg = tiny_dino_config(data_root, osp.join(work_dir, name), max_epochs=2,
                           num_workers=0)
    cfg.launcher = 'pytorch'
    cfg.randomness = dict(seed=0, diff_rank_seed=True)
    setup_cpu_distributed(cfg)
    train(cfg, name, hooks, resume_from)
    teardown_distributed()


if __name__ == '__main__':
    main()
