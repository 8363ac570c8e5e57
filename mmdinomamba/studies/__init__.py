"""Studies across models, built on the measures of one model in
:mod:`mmdinomamba.analysis`:

* :mod:`.comparison`: several backbones measured side by side on the same
  held-out images (k-NN, linear probe, Binary-AUC, mixing-matrix ranks), the
  report, and the DINO recipe on toy data with its preset table
  (``tools/run_recipe.py`` runs it);
* :mod:`.expressivity`: which token-mixer family can represent which target
  matrix: the probe, the targets, the sweep and the report
  (``tools/analysis/expressivity.py`` runs it).

Imports run ``tools -> studies -> analysis -> engine -> ...``: nothing below
imports a study, and a study starts no file of ``tools/`` (the caller hands in
the train command).
"""
