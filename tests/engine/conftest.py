"""The toy data of the DINO training tests (a module may define its own)."""
import pytest

from mmdinomamba.datasets import make_toy_dataset


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory):
    """16 training images (4 iterations of 4 images an epoch), 2 held-out, 48 px."""
    root = str(tmp_path_factory.mktemp('toy') / 'toy')
    make_toy_dataset(root, num_classes=2, train_per_class=8, val_per_class=1, size=48,
                     formats=['imagenet'])
    return root
