"""The DINO recipe on toy data, one preset at a time: the command line of
:mod:`mmdinomamba.studies.comparison.recipe`.

    python tools/run_recipe.py --preset demo      # = python tools/run_demo.py
    python tools/run_recipe.py --preset compare   # = python tools/run_comparison.py
    python tools/run_recipe.py --preset seq256    # = run_comparison.py --preset seq256
        [--work-dir DIR] [--data-root DIR] [--out DIR] [--device cpu|cuda]
        [--models ...] [--epochs N] [--parallel] [--cfg-options K=V ...] ...

``--preset`` picks the preset (a row of
``mmdinomamba/studies/comparison/presets.py``) whose defaults the other options
get; ``--help`` lists them. Each training run is ``tools/train.py CONFIG
--work-dir DIR`` in a process of its own: this tool hands the recipe that
command. It exits 1 if a step fails, or if a preset with a gate ('demo') fails
it. ``tools/run_demo.py`` and ``tools/run_comparison.py`` are this command line
with their own preset and choices.
"""
import argparse
import importlib.util
import logging
import logging.handlers
import os.path as osp
import sys
import time
from typing import Optional, Sequence

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
PRESET_NAMES = ('demo', 'compare', 'seq256')


def recipe_presets():
    """``mmdinomamba/studies/comparison/presets.py`` (data only), read without
    importing the package, whose import loads torch and the OpenMMLab
    registries: ``--help`` and bad arguments are answered at once."""
    if '_recipe_presets' in sys.modules:
        return sys.modules['_recipe_presets']
    spec = importlib.util.find_spec('mmdinomamba')  # finds it, runs nothing
    if spec is None or not spec.submodule_search_locations:
        sys.exit('mmdinomamba is not installed: run `make install` (or '
                 '`pip install -e .`) first')
    path = osp.join(spec.submodule_search_locations[0], 'studies', 'comparison',
                    'presets.py')
    module_spec = importlib.util.spec_from_file_location('_recipe_presets', path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # dataclasses look their module up
    module_spec.loader.exec_module(module)
    return module


def build_parser(preset, presets: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The command line of ``preset`` (a ``Preset``; relative paths are read from
    the current folder, the defaults lie in the repository), with ``--preset``
    among ``presets`` when there are several."""
    table = recipe_presets().PRESETS
    names = [m.name for m in preset.models]
    parser = argparse.ArgumentParser(description=preset.summary)
    if len(presets) > 1:
        parser.add_argument('--preset', choices=presets, default=preset.name,
                            help='which recipe (the defaults below are its own): ' +
                            '; '.join(f'{p}: {table[p].summary}' for p in presets))
    parser.add_argument('--work-dir', default=osp.join(ROOT, preset.work_dir),
                        help='folder for configs, checkpoints, logs and the report '
                        f'(default: {preset.work_dir} of the repository)')
    parser.add_argument('--data-root', default=osp.join(ROOT, preset.data_root),
                        help=f'toy dataset folder (default: {preset.data_root} of the '
                        'repository)')
    parser.add_argument('--out',
                        help='folder for the report, its JSON and its figures '
                        '(default: report/ in the work dir)')
    parser.add_argument('--models', nargs='+', choices=names, default=names,
                        help='which models to run (default: all)')
    parser.add_argument('--device', choices=['cpu', 'cuda'],
                        help='where training and measures run (default: cuda when '
                        'there is one); cpu trains in float32')
    parser.add_argument('--epochs', type=int,
                        help="DINO epochs (default: the config's), warm-up a tenth")
    parser.add_argument('--train-per-class', type=int,
                        default=preset.data['train_per_class'],
                        help='toy training images per class')
    parser.add_argument('--val-per-class', type=int,
                        default=preset.data['val_per_class'],
                        help='toy held-out images per class')
    parser.add_argument('--placement', choices=('centred', 'uniform'),
                        default=preset.data.get('placement', 'centred'),
                        help="where the toy objects go: 'uniform' (no centre bias) "
                        "or 'centred' (the shapes inside the image, their pixels "
                        "crowding its centre); default: the preset's, "
                        f"{preset.data.get('placement', 'centred')}")
    parser.add_argument('--rank-images', type=int, default=preset.rank_images,
                        help='held-out images whose mixing matrices are ranked '
                        '(0: none)')
    parser.add_argument('--num-workers', type=int,
                        help="data workers of every loader (default: the configs')")
    parser.add_argument('--parallel', action='store_true',
                        help='train the models at the same time (small models on '
                        'one GPU leave it mostly idle: each run is bound by its '
                        'host process)')
    parser.add_argument('--skip-train', action='store_true',
                        help='reuse the DINO runs of the work dir, and the linear '
                        'probes that finished')
    parser.add_argument('--no-probe', action='store_true', help='no linear probes')
    parser.add_argument('--probe-epochs', type=int,
                        help="the probes' epochs (default: their config's)")
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help='overrides of every DINO run (as tools/train.py '
                        'takes them); the model.backbone.* ones also reach the '
                        'probes')
    parser.add_argument('--probe-cfg-options', nargs='+', default=[],
                        metavar='KEY=VALUE', help='overrides of every linear probe')
    return parser


def parse_command_line(preset: str, argv: Optional[Sequence[str]] = None,
                       presets: Sequence[str] = ()):
    """(the chosen ``Preset``, the parsed ``argv``); ``--preset`` among
    ``presets`` picks the defaults. Bad values exit with argparse's usage error
    (status 2)."""
    if len(presets) > 1:
        first = argparse.ArgumentParser(add_help=False)
        first.add_argument('--preset', choices=presets, default=preset)
        preset = first.parse_known_args(argv)[0].preset
    chosen = recipe_presets().PRESETS[preset]
    parser = build_parser(chosen, presets)
    args = parser.parse_args(argv)
    for name in ('epochs', 'probe_epochs', 'train_per_class', 'val_per_class'):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f'--{name.replace("_", "-")} must be >= 1, got {value}')
    if args.device == 'cuda':
        import torch
        if not torch.cuda.is_available():
            # before the data, the configs and four trainings are written
            parser.error('--device cuda: this machine has no CUDA device '
                         '(torch.cuda.is_available() is False); run with --device '
                         'cpu (training in float32)')
    return chosen, args


def main(argv: Optional[Sequence[str]] = None, preset: str = 'demo',
         presets: Sequence[str] = PRESET_NAMES) -> None:
    """Parse ``argv`` (``preset``: the default; ``presets``: the choices of
    ``--preset``, none or one: no ``--preset``), run, exit 1 on a failed step or
    a failed gate."""
    chosen, args = parse_command_line(preset, argv, presets)
    # the warnings the libraries raise while they import (pkg_resources, ...) wait
    # here for the run's log file (recipe.log_to_file), off the screen
    logging.captureWarnings(True)
    logging.getLogger('py.warnings').addHandler(
        logging.handlers.MemoryHandler(10000, flushLevel=logging.CRITICAL + 1))
    import torch

    from mmdinomamba.studies.comparison.presets import PRESETS
    from mmdinomamba.studies.comparison.recipe import RecipeError, run_recipe
    if args.device is None:
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    chosen = PRESETS[chosen.name]
    train_command = [sys.executable, osp.join(ROOT, 'tools', 'train.py')]
    start = time.time()
    try:
        passed = run_recipe(chosen, ROOT, args, train_command)
    except (RecipeError, FileNotFoundError, ValueError) as err:
        sys.exit(f'{chosen.name} failed: {err}')
    print(f'[{time.time() - start:.0f} s in all]', flush=True)
    if not passed:
        sys.exit(1)


if __name__ == '__main__':
    main()
