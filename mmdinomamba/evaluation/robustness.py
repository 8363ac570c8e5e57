"""The paper's robustness table: which configs make each column, and the numbers.

Each column is one config ``configs/robustness/<model>_<suffix>.py`` (a
linear-probe config with another test set and metric); :data:`ROBUSTNESS_SETS`
says which metric key of ``Runner.test()`` is the column's number.
``tools/analysis/robustness.py`` runs the four and prints :func:`format_table`.
"""
import glob
import math
import os.path as osp
from typing import List, NamedTuple, Optional, Sequence

__all__ = [
    'RobustnessSet', 'ROBUSTNESS_SETS', 'BACKBONE_NAMES', 'PAPER_ROBUSTNESS',
    'robustness_config', 'robustness_row', 'format_table'
]


class RobustnessSet(NamedTuple):
    """One column of the table.

    Attributes:
        column (str): the paper's column name.
        suffix (str): config name suffix, ``<model>_<suffix>.py``.
        metric (str): key of the column's number in the test metrics (percent).
    """
    column: str
    suffix: str
    metric: str


ROBUSTNESS_SETS = (
    RobustnessSet('IN-Sketch', 'in-sketch', 'accuracy/top1'),
    RobustnessSet('IN-A', 'in-a', 'subset/top1'),
    RobustnessSet('IN-R', 'in-r', 'subset/top1'),
    RobustnessSet('ReaL', 'in-real', 'real/top1'),
)

#: config model name -> the paper's backbone name
BACKBONE_NAMES = {
    'dinovim-tiny-p16': 'DinoVim-T',
    'dinovim-small-p16': 'DinoVim-S',
    'dinovim-base-p16': 'DinoVim-B',
    'dinomamba-reg-base-p16': 'DinoMamba-Reg-B',
    'linearvit-base-p16': 'LinearViT-B',
    'vit-base-p16': 'ViT-B',
}

#: the paper's numbers, in the order of ROBUSTNESS_SETS (percent)
PAPER_ROBUSTNESS = {
    'vit-base-p16': (25.5, 15.4, 38.0, 84.6),
    'dinovim-base-p16': (27.6, 14.2, 33.1, 84.3),
    'linearvit-base-p16': (21.6, 9.6, 32.7, 81.3),
}


def robustness_config(config_dir: str, model: str, suffix: str) -> str:
    """Path of the config of one column for one model.

    Args:
        config_dir (str): the folder of the configs (``configs/robustness``).
        model (str): model name, e.g. ``'dinovim-base-p16'``.
        suffix (str): one of the ``suffix`` of :data:`ROBUSTNESS_SETS`.

    Returns:
        str: ``<config_dir>/<model>_<suffix>.py``.

    Raises:
        FileNotFoundError: if the config does not exist; names the models that
            have one.
    """
    path = osp.join(config_dir, f'{model}_{suffix}.py')
    if not osp.isfile(path):
        known = sorted({osp.basename(p).rsplit('_', 1)[0]
                        for p in glob.glob(osp.join(config_dir, '*_*.py'))})
        raise FileNotFoundError(f'no robustness config {path}; models with '
                                f'configs in {config_dir}: {known}')
    return path


def robustness_row(metrics: Sequence[Optional[dict]]) -> List[Optional[float]]:
    """The table row from the test metrics of each column.

    Args:
        metrics (Sequence[dict | None]): ``Runner.test()`` results, one per entry
            of :data:`ROBUSTNESS_SETS`; None for a column that was not run.

    Returns:
        list[float | None]: the column numbers (percent).
    """
    if len(metrics) != len(ROBUSTNESS_SETS):
        raise ValueError(f'expected {len(ROBUSTNESS_SETS)} metric dicts (one per '
                         f'column), got {len(metrics)}')
    row = []
    for spec, result in zip(ROBUSTNESS_SETS, metrics):
        if result is None:
            row.append(None)
        elif spec.metric not in result:
            raise ValueError(f'{spec.column}: metric {spec.metric} not in the test '
                             f'results {sorted(result)}')
        else:
            row.append(float(result[spec.metric]))
    return row


def format_table(model: str, row: Sequence[Optional[float]],
                 real_excluded: Optional[int] = None) -> str:
    """The measured row, and the paper's row when the paper has this backbone.

    Args:
        model (str): model name, e.g. ``'dinovim-base-p16'``.
        row (Sequence[float | None]): from :func:`robustness_row`.
        real_excluded (int, optional): images without ReaL labels, noted under
            the table.

    Returns:
        str: a plain-text table, one line per row.
    """
    name = BACKBONE_NAMES.get(model, model)
    rows = [(name, row)]
    if model in PAPER_ROBUSTNESS:
        rows.append((f'{name} (paper)', PAPER_ROBUSTNESS[model]))
    if len(row) != len(ROBUSTNESS_SETS):
        raise ValueError(f'expected {len(ROBUSTNESS_SETS)} numbers (one per '
                         f'column), got {len(row)}')
    width = max(len('backbone'), *(len(label) for label, _ in rows))

    def cell(value: Optional[float], spec: RobustnessSet) -> str:
        text = '-' if value is None or math.isnan(value) else f'{value:.1f}'
        return text.rjust(max(len(spec.column), 5))

    lines = [' '.join(['backbone'.ljust(width)] + [
        spec.column.rjust(max(len(spec.column), 5)) for spec in ROBUSTNESS_SETS])]
    for label, values in rows:
        lines.append(' '.join([label.ljust(width)] + [
            cell(value, spec) for value, spec in zip(values, ROBUSTNESS_SETS)]))
    if real_excluded is not None:
        lines.append(f'ReaL: {real_excluded} images without labels excluded')
    return '\n'.join(lines)

