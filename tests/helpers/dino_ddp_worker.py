"""Run by torchrun in test_dino_training.py and test_multinode.py: train the tiny
toy DINO, save each rank's centre and parameters (student, heads and teacher).

Usage (from the repository root): torchrun --nproc_per_node=2 -m
tests.helpers.dino_ddp_worker DATA_ROOT WORK_DIR
"""
import os.path as osp
import sys

from mmengine.runner import Runner

from tests.helpers.toy_training import tiny_dino_config

from mmdinomamba.engine import setup_cpu_distributed, teardown_distributed
from mmdinomamba.utils import save_atomic


def main():
    data_root, work_dir = sys.argv[1:3]
    cfg = tiny_dino_config(data_root, work_dir, max_epochs=1)
    cfg.launcher = 'pytorch'
    if not setup_cpu_distributed(cfg):
        raise RuntimeError('expected a CPU-only torchrun job')
    runner = Runner.from_cfg(cfg)
    runner.train()
    model = runner.model.module
    save_atomic(dict(center=model.loss_module.center.clone(),
                     teacher=model.teacher.state_dict(),
                     parameters={k: v.detach() for k, v in model.named_parameters()},
                     iter=runner.iter,
                     world_size=runner.world_size),
                osp.join(work_dir, f'state_rank{runner.rank}.pth'))
    teardown_distributed()


if __name__ == '__main__':
    main()
