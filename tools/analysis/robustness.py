"""Run the four robustness tests of a linear probe and print the paper's table row.

    python tools/analysis/robustness.py MODEL PROBE_CHECKPOINT
        [--sets IN-Sketch IN-A IN-R ReaL] [--config-dir DIR]
        [--work-dir DIR] [--out FILE.json] [--cfg-options k=v ...] [--no-strict]

MODEL names the configs ``<config-dir>/<MODEL>_<set>.py``. With the shipped configs
(no ``--config-dir``; they are found from any folder) MODEL is a backbone name of
:data:`mmdinomamba.zoo.BACKBONES` or its alias (``dinovim-base``, ``dinovim-b``,
``dinovim-base-p16``). Each config is run as ``tools/test.py`` runs it, and the table
puts the measured row next to the paper's numbers when the paper has the backbone.
``--cfg-options`` applies to every set. The checkpoint is checked as
``tools/test.py`` checks it: a file that does not fit the probe (another
architecture or width, a DINO pretraining checkpoint, an official release) or
holds NaN or infinite values is refused, naming the tensors, and no row is printed
(``--no-strict`` lets it leave tensors uninitialised, never the whole backbone).
``--out`` writes the numbers and all metrics as JSON, atomically.
"""
import argparse
import os.path as osp

from mmengine.config import DictAction


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('model', help='model name, e.g. dinovim-base (or dinovim-b, '
                        'dinovim-base-p16); with --config-dir, the configs\' prefix')
    parser.add_argument('checkpoint', help='linear-probe checkpoint')
    parser.add_argument('--sets', nargs='+', metavar='SET',
                        help='columns to run, of IN-Sketch, IN-A, IN-R and ReaL '
                        '(default: all four)')
    parser.add_argument('--config-dir',
                        help='folder of the <model>_<set>.py configs (default: the '
                        'shipped configs/robustness)')
    parser.add_argument('--work-dir', help='logs go to WORK_DIR/<set>; default '
                        'work_dirs/robustness/<model>')
    parser.add_argument('--out', help='write the row and the metrics to this JSON')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of every config, key=value')
    parser.add_argument('--no-strict', action='store_true',
                        help='let the checkpoint leave probe tensors uninitialised '
                        '(default: refuse, naming them); a tensor of another shape '
                        'is refused either way, and so is scoring a backbone that '
                        'the checkpoint does not fill at all')
    return parser.parse_args(argv)


def run_set(config: str, checkpoint: str, work_dir: str, cfg_options=None,
            strict: bool = True) -> dict:
    """``Runner.test()`` of one config with the probe checkpoint, as
    ``tools/test.py`` runs it: the checkpoint must fit and fill the model and be
    finite (:class:`~mmdinomamba.engine.StrictLoadHook`; ``strict=False`` lets it
    leave tensors uninitialised, never the whole backbone), and the data must fit
    the model. Returns its metrics."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    import mmdinomamba  # noqa: F401  (registers our classes)
    from mmdinomamba.engine import StrictLoadHook, build_checked_loop
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cfg.work_dir = work_dir
    cfg.load_from = checkpoint
    runner = Runner.from_cfg(cfg)
    runner.register_hook(StrictLoadHook(strict=strict, evaluation=True))
    build_checked_loop(runner, 'test')
    return runner.test()


def shipped_config_prefix(model: str) -> str:
    """The prefix of the shipped configs for a backbone name or alias
    (``dinovim-b`` -> ``dinovim-base-p16``); an unknown name is kept as it is, so
    that the missing config is reported with the known ones."""
    from mmdinomamba.zoo import canonical_name
    try:
        name = canonical_name(model)
    except ValueError:
        return model
    return name if name.endswith(('-p16', '-p8')) else name + '-p16'


def main(argv=None) -> dict:
    args = parse_args(argv)
    # imported after parsing, so that --help answers at once
    from mmdinomamba.evaluation.robustness import (PAPER_ROBUSTNESS, ROBUSTNESS_SETS,
                                                   format_table, robustness_config,
                                                   robustness_row)
    from mmdinomamba.utils import allow_mmengine_checkpoint_types, dump_atomic
    from mmdinomamba.zoo import config_path
    columns = [spec.column for spec in ROBUSTNESS_SETS]
    unknown = [name for name in args.sets or () if name not in columns]
    if unknown:
        raise ValueError(f'--sets: unknown set {unknown[0]!r}; the sets: {columns}')
    args.sets = args.sets or columns
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint not found: {args.checkpoint}')
    if args.config_dir is None:
        config_dir, model = config_path('robustness'), shipped_config_prefix(args.model)
    else:
        config_dir, model = args.config_dir, args.model
    work_dir = args.work_dir or osp.join('work_dirs', 'robustness', model)
    configs = {spec.column: robustness_config(config_dir, model, spec.suffix)
               for spec in ROBUSTNESS_SETS if spec.column in args.sets}
    allow_mmengine_checkpoint_types()
    metrics = {column: run_set(config, args.checkpoint, osp.join(work_dir, column),
                               args.cfg_options, strict=not args.no_strict)
               for column, config in configs.items()}
    row = robustness_row([metrics.get(column) for column in columns])
    excluded = metrics['ReaL']['real/excluded'] if 'ReaL' in metrics else None
    print(format_table(model, row, excluded))
    result = dict(model=model, checkpoint=args.checkpoint,
                  columns=columns, row=row, paper=PAPER_ROBUSTNESS.get(model),
                  metrics=metrics)
    if args.out:
        dump_atomic(result, args.out)
        print(f'written to {args.out}')
    return result


if __name__ == '__main__':
    main()
