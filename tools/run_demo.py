"""The embedded default: DINO pretraining and a linear probe on toy data, on a CPU.

    python tools/run_demo.py [--data-root data/toy] [--work-dir work_dirs/demo]
                             [--cfg-options KEY=VALUE ...]  # DINO config overrides

The 'demo' preset of ``tools/run_recipe.py``
(:mod:`mmdinomamba.studies.comparison.recipe`): the toy dataset, DINO
pretraining of a 4-block DinoVim
(``configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py``), its teacher, a linear
probe on it, and the teacher against the same backbone at its random init on
2000 held-out images (k-NN top-1, the Binary-AUC of the attention and cosine
maps, the paired gain), with the report and its figures in
``<work-dir>/report/``. It fails (exit status 1) if a step fails, if the DINO or
the probe's loss is not lower in the last epoch than in the first, or if the
teacher's mean over the held-out images is not higher than its init's on both
k-NN and the attention map's Binary-AUC (docs/dino.md, "The demo"). ``--help``
lists the other options.
"""
import os.path as osp
import runpy


def main(argv=None):
    """``tools/run_recipe.py`` (the command line of every preset, beside this
    file) with this alias's preset."""
    tool = runpy.run_path(osp.join(osp.dirname(osp.abspath(__file__)),
                                   'run_recipe.py'))
    tool['main'](argv, preset='demo', presets=())


if __name__ == '__main__':
    main()
