"""Evaluate a checkpoint with a config: the usual OpenMMLab entry point.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out FILE] [--no-strict]
                         [--cfg-options k=v ...] [--launcher pytorch]

The checkpoint must fit and fill the model and be finite (``StrictLoadHook``:
a tensor of another shape is refused and nothing is loaded; ``--no-strict`` allows
missing tensors, which keep their initial values, but never scores a backbone
the checkpoint does not fill at all), and the test data must fit the model (see :mod:`mmdinomamba.engine.run_checks`).
"""
import argparse
import os
import os.path as osp

# torch, mmengine's runner and the package are imported after the arguments are
# parsed, so that --help answers at once
from mmengine.config import DictAction


def parse_args():
    parser = argparse.ArgumentParser(description='Test (evaluate) a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save logs and results')
    parser.add_argument('--out', help='dump the metrics to this JSON/pickle file')
    add_run_args(parser)
    args = parser.parse_args()
    if 'LOCAL_RANK' not in os.environ:  # the launcher's wins
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """The options tools/train.py and tools/test.py share (tests/tools check that
    both parse them alike): ``--cfg-options``, ``--no-strict``, ``--launcher``,
    ``--local-rank``."""
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override settings in the config, key=value (e.g. '
        'model.backbone.arch=tiny train_dataloader.batch_size=8)')
    parser.add_argument('--no-strict', action='store_true',
                        help='let the checkpoint (load_from, or the one tested) '
                        'leave model tensors uninitialised (they keep their initial '
                        'values; default: refuse, naming them)')
    parser.add_argument('--launcher', choices=('none', 'pytorch', 'slurm', 'mpi'),
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def main():
    args = parse_args()
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    from mmengine.config import Config
    from mmengine.runner import Runner

    import mmdinomamba  # noqa: F401  (registers our classes)
    from mmdinomamba.engine import (StrictLoadHook, build_checked_loop,
                                    check_config_keys, set_work_dir,
                                    setup_cpu_distributed, setup_cpu_threads,
                                    teardown_distributed)
    cfg = Config.fromfile(args.config)
    keys = list(cfg.keys())
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    check_config_keys(cfg, keys)  # warns about typos the Runner would ignore
    set_work_dir(cfg, args.work_dir, args.config)
    cfg.load_from = args.checkpoint
    setup_cpu_threads()  # one thread on a CPU-only machine, unless OMP_NUM_THREADS
    setup_cpu_distributed(cfg)  # --launcher pytorch on a CPU-only machine
    runner = Runner.from_cfg(cfg)
    runner.register_hook(StrictLoadHook(strict=not args.no_strict, evaluation=True))
    build_checked_loop(runner, 'test')  # named errors for data that cannot be tested
    metrics = runner.test()
    if args.out:
        from mmdinomamba.utils import dump_atomic
        dump_atomic(metrics, args.out)
        runner.logger.info(f'metrics written to {args.out}')
    teardown_distributed()  # every process done, then the group goes


if __name__ == '__main__':
    main()
