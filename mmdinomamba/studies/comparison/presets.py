"""The recipes' presets and command line, as data and argparse only.

Nothing here imports torch, mmengine or the rest of the package's dependencies:
``tools/run_demo.py`` and ``tools/run_comparison.py`` read this file on its own to
answer ``--help`` and reject bad arguments at once, before
:mod:`mmdinomamba.studies.comparison.recipe` (which runs the recipe) is imported.
"""
import argparse
import os.path as osp
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

__all__ = ['COMPARE_MODELS', 'DEMO_MODELS', 'PRESETS', 'Preset', 'RecipeModel',
           'SEQ256_MODELS', 'build_parser', 'parse_command_line']


@dataclass(frozen=True)
class RecipeModel:
    """One model of a recipe.

    Attributes:
        name (str): its name in the work dir and the report.
        dino (str): its DINO config, relative to the repository root.
        probe (str): its linear-probe config (the same backbone, frozen).
    """
    name: str
    dino: str
    probe: str


# The comparison's models, a row each: same width, depth, data, head and schedule
# (configs/compare/), only the token mixer differs.
COMPARE_MODELS = (
    RecipeModel('vit', 'configs/compare/dino_vit-d192-l12-p8_1xb128-20e_toy-rich.py',
                'configs/compare/linear-probe_vit-d192-l12-p8_1xb128-30e_toy-rich.py'),
    RecipeModel('dinovim',
                'configs/compare/dino_dinovim-d192-l12-p8_1xb128-20e_toy-rich.py',
                'configs/compare/linear-probe_dinovim-d192-l12-p8_1xb128-30e_toy-rich.py'),
    RecipeModel('linearvit',
                'configs/compare/dino_linearvit-d192-l12-p8_1xb128-20e_toy-rich.py',
                'configs/compare/linear-probe_linearvit-d192-l12-p8_1xb128-30e_toy-rich.py'),
    RecipeModel('mlla', 'configs/compare/dino_mlla-d192-l12-p8_1xb128-20e_toy-rich.py',
                'configs/compare/linear-probe_mlla-d192-l12-p8_1xb128-30e_toy-rich.py'),
)
# The same four at 256 tokens: 4 px patches on the same 64 px images
SEQ256_MODELS = tuple(
    RecipeModel(m.name, m.dino.replace('-p8_1xb128-20e_', '-p4_1xb64-6e_'),
                m.probe.replace('-p8_1xb128-30e_', '-p4_1xb64-5e_'))
    for m in COMPARE_MODELS)
DEMO_MODELS = (
    RecipeModel('dinovim-toy', 'configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py',
                'configs/linear_probe/dinovim-toy-p8_1xb16-linear-10e_toy.py'),
)


@dataclass(frozen=True)
class Preset:
    """What a recipe runs, as data.

    Attributes:
        name (str): its name (a key of :data:`PRESETS`).
        summary (str): one line for ``--help``.
        models (tuple[RecipeModel]): the models.
        data (dict): :func:`~mmdinomamba.datasets.make_toy_dataset` arguments.
        replace_data (bool): replace a toy dataset made with other arguments.
        data_root (str): the default data root, relative to the repository root.
        work_dir (str): the default work dir, relative to the repository root.
        probe_init (bool): also probe the init, not only the teacher.
        probes_in_report (bool): the report scores each probe on the held-out
            images (the probes' test pipeline must be the report's: a resize to
            the image size).
        rank_images (int): held-out images whose mixing matrices are ranked.
        layers (tuple[int], optional): the blocks measured; None: every block.
        gate (bool): fail unless every loss fell and each teacher beats its
            init on both headline measures.
        title (str): the report's title.
    """
    name: str
    summary: str
    models: Tuple[RecipeModel, ...]
    data: dict
    replace_data: bool
    data_root: str
    work_dir: str
    probe_init: bool
    probes_in_report: bool
    rank_images: int
    layers: Optional[Tuple[int, ...]]
    gate: bool
    title: str = 'Token mixers side by side'
    map_methods: Tuple[str, ...] = field(default=('attention', 'cosine'))


PRESETS = {
    # 4-class rich toy data, 64 px: 256 training images and 2000 held-out ones
    # (on 200 the k-NN gain of the teacher was within the noise of the images drawn)
    'demo': Preset(
        name='demo',
        summary='The embedded default: DINO pretraining of a tiny DinoVim on toy '
        'data, on a CPU, then its teacher against its random init',
        models=DEMO_MODELS,
        data=dict(style='rich', train_per_class=64, val_per_class=500, size=64),
        replace_data=True, data_root='data/toy', work_dir='work_dirs/demo',
        probe_init=False, probes_in_report=False, rank_images=0, layers=(-1, ),
        gate=True, title='The DINO teacher against its random init'),
    'compare': Preset(
        name='compare',
        summary='The small comparison recipe: softmax, Mamba-2 (SSD), linear and '
        'MLLA-style linear attention side by side, each DINO teacher against its '
        'random init',
        models=COMPARE_MODELS,
        data=dict(num_classes=12, train_per_class=500, val_per_class=100, size=64,
                  formats=('imagenet', ), style='rich', placement='uniform'),
        replace_data=False, data_root='data/toy_rich_compare',
        work_dir='work_dirs/compare', probe_init=True, probes_in_report=True,
        rank_images=4, layers=None, gate=False),
    # the four at 256 tokens (4 px patches), where a head of width 64 or 32 bounds
    # the rank of a linear-attention map well below the sequence length. Sized for
    # 14 minutes of one H100/H200 (docs/comparison.md, "At 256 tokens"): 250
    # training and 40 held-out images per class, 6 DINO and 5 probe epochs,
    # ranks on 2 images
    'seq256': Preset(
        name='seq256',
        summary='The comparison at 256 tokens (4 px patches on the 64 px toy '
        'images): the four mixers side by side where the rank bound of linear '
        'attention bites',
        models=SEQ256_MODELS,
        data=dict(num_classes=12, train_per_class=250, val_per_class=40, size=64,
                  formats=('imagenet', ), style='rich', placement='uniform'),
        replace_data=False, data_root='data/toy_rich_seq256',
        work_dir='work_dirs/compare_seq256', probe_init=True, probes_in_report=True,
        rank_images=2, layers=None, gate=False,
        title='Token mixers side by side at 256 tokens'),
}


def build_parser(preset: Preset, root: str,
                 presets: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The command line of ``preset`` (relative paths are read from the current
    folder; the defaults lie under ``root``), with ``--preset`` among
    ``presets`` when there are several."""
    names = [m.name for m in preset.models]
    parser = argparse.ArgumentParser(description=preset.summary)
    if len(presets) > 1:
        parser.add_argument('--preset', choices=presets, default=preset.name,
                            help='which recipe (the defaults below are its own): ' +
                            '; '.join(f'{p}: {PRESETS[p].summary}' for p in presets))
    parser.add_argument('--work-dir', default=osp.join(root, preset.work_dir),
                        help='folder for configs, checkpoints, logs and the report '
                        f'(default: {preset.work_dir} of the repository)')
    parser.add_argument('--data-root', default=osp.join(root, preset.data_root),
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


def parse_command_line(preset: str, root: str, argv: Optional[Sequence[str]] = None,
                       presets: Sequence[str] = ()
                       ) -> Tuple['Preset', argparse.Namespace]:
    """The chosen preset and the parsed ``argv`` (``--preset`` among ``presets``
    picks the defaults); bad values exit with argparse's usage error (status 2)."""
    if len(presets) > 1:
        first = argparse.ArgumentParser(add_help=False)
        first.add_argument('--preset', choices=presets, default=preset)
        preset = first.parse_known_args(argv)[0].preset
    chosen = PRESETS[preset]
    parser = build_parser(chosen, root, presets)
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
