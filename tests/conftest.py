"""Test isolation for mmengine's process-wide state.

Building from an mmseg/mmdet config makes that package the current
``DefaultScope`` for the rest of the process, so a later test that builds from
mmpretrain's registry would silently resolve names (``DINO``!) in mmdet's. Each
test starts from the scopes that existed before it.
"""
import pytest
from mmengine.registry import DefaultScope


@pytest.fixture(autouse=True)
def _restore_default_scope():
    saved = dict(DefaultScope._instance_dict)
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(saved)
