"""tests/data/: the official reference outputs stay small, each is explained in
its README, and a missing one fails the tests that need it (never a skip)."""
import os
import os.path as osp

import pytest

from tests.helpers import reference_data
from tests.helpers.reference_data import DATA, MAMBAR, MLLA, VIM, reference_path

LIMIT = 25_000_000  # bytes: the whole folder


def test_the_folder_is_at_most_25_mb():
    total = sum(osp.getsize(osp.join(DATA, name)) for name in os.listdir(DATA))
    assert total <= LIMIT, f'tests/data holds {total / 1e6:.1f} MB (at most 25 MB)'


def test_the_readme_explains_every_file():
    with open(osp.join(DATA, 'README.md'), encoding='utf-8') as f:
        text = f.read()
    names = sorted(n for n in os.listdir(DATA) if n != 'README.md'
                   and not n.startswith('.') and n != '__pycache__')
    assert {VIM, MAMBAR, MLLA, 'make_official_mlla.py'} <= set(names)
    unexplained = [n for n in names if f'`{n}`' not in text]
    assert not unexplained, f'tests/data/README.md does not explain {unexplained}'
    for fact in ('66b6d297e5c93ef3f8821570daf41b71b6f7782f', 'LeapLabTHU/MLLA',
                 'yangtiming/Dino-Mamba', 'python tests/data/make_official_mlla.py'):
        assert fact in text


def test_a_missing_file_fails_the_test(monkeypatch, tmp_path):
    monkeypatch.setattr(reference_data, 'DATA', str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match='reference file missing: .*'
                       + VIM + r'.*git checkout -- tests/data'):
        reference_path(VIM)
