"""The shipped leaf configs, each parsed once per test session.

A leaf is every ``configs/**/*.py`` outside a ``_base_`` folder. Parsing one takes
about a second (``mmseg::``/``mmdet::`` bases read every model-zoo metafile of the
package), and several test modules read them all: :func:`load` parses a path once,
the upstream metafiles once, and hands out a copy.
"""
import copy
import functools
import glob
import os
import os.path as osp
from typing import List

import mmengine.config.utils
from mmengine.config import Config

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = osp.join(ROOT, 'configs')

_upstream_load = functools.lru_cache(maxsize=None)(mmengine.config.utils.load)


def leaf_configs() -> List[str]:
    """Every leaf config's path, sorted."""
    paths = glob.glob(osp.join(CONFIGS, '**', '*.py'), recursive=True)
    return sorted(p for p in paths
                  if '_base_' not in osp.relpath(p, CONFIGS).split(os.sep))


def leaf_id(path: str) -> str:
    """``family/name``: the path below configs/ without ``.py``."""
    return osp.splitext(osp.relpath(path, CONFIGS))[0]


@functools.lru_cache(maxsize=None)
def _parsed(path: str) -> Config:
    original = mmengine.config.utils.load
    mmengine.config.utils.load = _upstream_load
    try:
        return Config.fromfile(path, format_python_code=False)
    finally:
        mmengine.config.utils.load = original


def load(path: str) -> Config:
    """The merged config at ``path`` (a copy: change it freely)."""
    return copy.deepcopy(_parsed(path))
