"""The official models' reference outputs that the tests compare against.

They live in ``tests/data/`` (``tests/data/README.md`` says how each file was made:
the official repository and commit, the settings, the script). A missing file is a
test failure, never a skip: these are the tests that prove our models compute what
the official ones compute.
"""
import os.path as osp

import pytest

DATA = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'data')
VIM = 'official_vim_d256_depth4.pt'
MAMBAR = 'official_mambar_d256_depth4.pt'
MLLA = 'official_mlla_small.pt'


def reference_path(name: str) -> str:
    """Absolute path of ``tests/data/<name>``; fails the test if it is missing."""
    path = osp.join(DATA, name)
    if not osp.isfile(path):
        pytest.fail(f'reference file missing: {path} (it is part of the repository: '
                    'restore it with `git checkout -- tests/data`; tests/data/README.md '
                    'says how it was made)')
    return path


def load_reference(name: str) -> dict:
    """``torch.load`` of ``tests/data/<name>`` (tensors and plain types only)."""
    import torch
    return torch.load(reference_path(name), weights_only=True)
