"""Train a model from a config: the usual OpenMMLab entry point.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp]
                          [--no-strict] [--cfg-options k=v ...] [--launcher pytorch]

Works for mmpretrain, mmseg and mmdet configs alike: the config's
``default_scope`` picks the registries, and ``mmdinomamba`` is imported so our
classes are registered. The run holds the lock of every folder it writes (one
run per work_dir and per checkpoint out_dir), a ``load_from`` or ``--resume``
checkpoint must fit and fill the model and be finite (a tensor of another shape is
refused; ``--no-strict`` allows missing tensors), and the data is checked before
training starts (see
:mod:`mmdinomamba.engine.run_checks`).
"""
import argparse
import os
import os.path as osp
from contextlib import ExitStack

# torch, mmengine's runner and the package are imported after the arguments are
# parsed, so that --help answers at once
from mmengine.config import DictAction

CONFIG_ROOT = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'configs')


def parse_args():
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and checkpoints')
    parser.add_argument(
        '--resume', nargs='?', type=str, const='auto',
        help='resume from the given checkpoint, or from the latest checkpoint '
        'in the work dir if no path is given')
    parser.add_argument('--amp', action='store_true',
                        help='enable automatic mixed precision training')
    parser.add_argument('--amp-dtype', choices=['float16', 'bfloat16'],
                        default=None, help='AMP dtype (default: float16 with a '
                        'dynamic loss scale)')
    parser.add_argument('--no-validate', action='store_true',
                        help='do not evaluate during training')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the learning rate by the actual batch size')
    add_run_args(parser)
    args = parser.parse_args()
    if 'LOCAL_RANK' not in os.environ:  # the launcher's wins
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """The options tools/train.py and tools/test.py share (tests/tools check that
    both parse them alike): ``--cfg-options``, ``--no-strict``, ``--launcher``,
    ``--local-rank``, as OpenMMLab's tools take them."""
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


def merge_args(cfg: 'Config', args) -> 'Config':
    from mmdinomamba.engine import (amp_twin, check_resume_checkpoint,
                                    find_resume_checkpoint, set_work_dir)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    set_work_dir(cfg, args.work_dir, args.config)
    if args.amp or args.amp_dtype:
        cfg.optim_wrapper.type = amp_twin(cfg.optim_wrapper.get('type', 'OptimWrapper'),
                                          amp=True)
        if args.amp_dtype == 'bfloat16':
            cfg.optim_wrapper.dtype = 'bfloat16'
        else:
            cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.resume == 'auto':
        # fails naming the file when work_dir/last_checkpoint is empty or dangling;
        # None (nothing saved yet) starts from scratch
        cfg.resume = True
        cfg.load_from = find_resume_checkpoint(cfg.work_dir)
    elif args.resume is not None:
        check_resume_checkpoint(args.resume)
        cfg.resume = True
        cfg.load_from = args.resume
    if args.no_validate:
        cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg:
            raise ValueError('--auto-scale-lr needs `auto_scale_lr` in the config')
        cfg.auto_scale_lr.enable = True
    return cfg


def is_first_process() -> bool:
    """Rank 0 of the job (read before the process group exists)."""
    return int(os.environ.get('RANK', os.environ.get('SLURM_PROCID', 0))) == 0


def main():
    args = parse_args()
    from mmengine.config import Config
    from mmengine.runner import Runner

    import mmdinomamba  # noqa: F401  (registers our classes)
    from mmdinomamba.engine import (StrictLoadHook, WorkDirLock, build_checked_loop,
                                    check_config_keys, check_pretrained_checkpoints,
                                    run_folders, setup_cpu_distributed,
                                    setup_cpu_threads, teardown_distributed)
    cfg = Config.fromfile(args.config)
    keys = list(cfg.keys())
    cfg = merge_args(cfg, args)
    check_config_keys(cfg, keys)  # warns about typos the Runner would ignore
    check_pretrained_checkpoints(cfg, CONFIG_ROOT)  # name the command that makes it
    setup_cpu_threads()  # one thread on a CPU-only machine, unless OMP_NUM_THREADS
    with ExitStack() as stack:
        if is_first_process():
            # one run per work_dir and per checkpoint out_dir
            stack.enter_context(WorkDirLock(*run_folders(cfg)))
        setup_cpu_distributed(cfg)  # --launcher pytorch on a CPU-only machine
        runner = Runner.from_cfg(cfg)
        runner.register_hook(StrictLoadHook(strict=not args.no_strict))
        build_checked_loop(runner, 'train')  # named errors for data that cannot train
        runner.train()
        teardown_distributed()  # every process done, then the group goes


if __name__ == '__main__':
    main()
