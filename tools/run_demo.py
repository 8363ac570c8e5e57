"""The embedded default: DINO pretraining and a linear probe on toy data, on a CPU.

    python tools/run_demo.py [--data-root data/toy] [--work-dir work_dirs/demo]
                             [--cfg-options KEY=VALUE ...]  # DINO config overrides

The 'demo' preset of :mod:`mmdinomamba.studies.comparison.recipe`: the toy dataset, DINO
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
import importlib.util
import logging
import logging.handlers
import os.path as osp
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def recipe_presets():
    """``mmdinomamba/studies/comparison/presets.py`` (data and argparse only), read
    without importing the package, whose import loads torch and the OpenMMLab
    registries: ``--help`` and bad arguments are answered at once."""
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


def main(argv=None):
    recipe_presets().parse_command_line('demo', ROOT, argv, ())
    # the warnings the libraries raise while they import (pkg_resources, ...) wait
    # here for the run's log file (recipe.log_to_file), off the screen
    logging.captureWarnings(True)
    logging.getLogger('py.warnings').addHandler(
        logging.handlers.MemoryHandler(10000, flushLevel=logging.CRITICAL + 1))
    from mmdinomamba.studies.comparison.recipe import main as run
    run('demo', ROOT, argv, ())


if __name__ == '__main__':
    main()
