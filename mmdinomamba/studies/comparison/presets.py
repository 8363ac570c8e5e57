"""The recipes' presets, as data only.

Nothing here imports torch, mmengine or the rest of the package's dependencies:
``tools/run_recipe.py`` reads this file on its own to build its command line,
answer ``--help`` and reject bad arguments at once, before
:mod:`mmdinomamba.studies.comparison.recipe` (which runs the recipe) is imported.
"""
from dataclasses import dataclass, field
from typing import Optional, Tuple

__all__ = ['COMPARE_MODELS', 'DEMO_MODELS', 'PRESETS', 'Preset', 'RecipeModel',
           'SEQ256_MODELS']


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

