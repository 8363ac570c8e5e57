"""Which token-mixer family can represent which target matrix: the probe
(:mod:`.probe`), the targets and their certified floors (:mod:`.targets`), the
sweep (:mod:`.sweep`) and its report (:mod:`.report`); the method and the
results: docs/expressivity.md."""
from .probe import FAMILIES, FitResult, ProbeModel, family_floors, fit_matrix
from .report import write_expressivity_report
from .sweep import DEFAULT_GRIDS, Budget, Grid, plan_sweep, run_sweep
from .targets import TARGETS, build_target

__all__ = ['Budget', 'DEFAULT_GRIDS', 'FAMILIES', 'FitResult', 'Grid', 'ProbeModel',
           'TARGETS', 'build_target', 'family_floors', 'fit_matrix', 'plan_sweep',
           'run_sweep', 'write_expressivity_report']
