"""Shared test fixtures.

Test isolation for mmengine's process-wide state: building from an mmseg/mmdet
config makes that package the current ``DefaultScope`` for the rest of the
process, so a later test that builds from mmpretrain's registry would silently
resolve names (``DINO``!) in mmdet's. Each test starts from the scopes that
existed before it.

``load_tool``: the scripts under ``tools/`` are not a package; tests import them
by path.
"""
import importlib.util
import os.path as osp

import pytest
from mmengine.registry import DefaultScope

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


@pytest.fixture(scope='session')
def load_tool():
    """``load_tool('tools/train.py')``: the script imported as a module."""
    def load(relpath: str):
        name = '_tool_' + relpath[:-len('.py')].replace('/', '_')
        spec = importlib.util.spec_from_file_location(name, osp.join(REPO, relpath))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture(autouse=True)
def _restore_default_scope():
    saved = dict(DefaultScope._instance_dict)
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(saved)
