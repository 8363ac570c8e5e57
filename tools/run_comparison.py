"""The small comparison recipe: softmax, SSD, linear and MLLA attention side by side.

    python tools/run_comparison.py [--work-dir work_dirs/compare] [--epochs 20]
        [--data-root data/toy_rich_compare] [--device cpu|cuda] [--models ...]
        [--train-per-class 500] [--val-per-class 100] [--parallel]
        [--cfg-options K=V ...] [--probe-epochs N] [--probe-cfg-options K=V ...]
        [--out DIR] [--preset compare|seq256]

The 'compare' preset of ``tools/run_recipe.py``
(:mod:`mmdinomamba.studies.comparison.recipe`): the rich toy data
(12 shape-and-texture classes, 64 px, with masks), DINO pretraining of each
model of ``configs/compare/`` (ViT, DinoVim, LinearViT, PlainMLLA: same width,
depth, data, head and schedule), each teacher and each run's init
(``init.pth``), a linear probe on each, and the report (``--out``, by default
``<work-dir>/report/``: ``report.md`` and its figures: k-NN, probe, Binary-AUC
by block, mixing-matrix ranks, each teacher's paired gain over its init).
``--preset seq256`` runs the same four at 256 tokens (4 px patches; its own
data root, work dir and budget: docs/comparison.md, "At 256 tokens").
``--epochs E`` sets each run's length by name (warm-up a tenth). A check of
the whole chain on a CPU with a tiny budget::

    python tools/run_comparison.py --work-dir /tmp/cmp --device cpu --epochs 1 \\
        --train-per-class 4 --val-per-class 2 --rank-images 1 --num-workers 0 \\
        --cfg-options model.backbone.arch.num_layers=2 train_dataloader.batch_size=8 \\
        --no-probe

(the probes read the last 4 blocks: a 2-block run needs ``--probe-cfg-options
model.backbone.out_indices=[-2,-1] model.backbone.frozen_stages=2
model.neck.in_channels=384 model.head.in_channels=384`` instead of ``--no-probe``).
"""
import os.path as osp
import runpy


def main(argv=None):
    """``tools/run_recipe.py`` (the command line of every preset, beside this
    file) with this alias's preset."""
    tool = runpy.run_path(osp.join(osp.dirname(osp.abspath(__file__)),
                                   'run_recipe.py'))
    tool['main'](argv, preset='compare', presets=('compare', 'seq256'))


if __name__ == '__main__':
    main()
