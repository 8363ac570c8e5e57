"""tools/run_demo.py: the 'demo' preset of the recipe from its command line (its
full run takes minutes: README); the recipe's parts: tests/studies/test_recipe.py."""
import os.path as osp
import sys

import pytest
from mmengine.config import Config

from mmdinomamba.studies.comparison import recipe


@pytest.fixture(scope='module')
def demo(load_tool):
    return load_tool('tools/run_demo.py')


class Stop(Exception):
    pass


def test_options_reach_the_dino_run(demo, tmp_path, monkeypatch):
    """``--cfg-options`` reach the DINO run's config after the data root, which
    this repository's tools/train.py trains; library logs go to the work dir's
    recipe.log, not the screen."""
    started = []

    def stop(*args, **kwargs):
        started.append(args)
        raise Stop

    monkeypatch.setattr(recipe, 'TrainingRun', stop)
    work = tmp_path / 'demo'
    root = osp.dirname(osp.dirname(demo.__file__))
    with pytest.raises(Stop):
        demo.main([
            '--data-root', str(tmp_path / 'toy'), '--work-dir', str(work),
            '--train-per-class', '1', '--val-per-class', '1', '--device', 'cpu',
            '--cfg-options', 'randomness.seed=1', 'train_cfg.max_epochs=2'])
    (label, run_root, command, config, *_), = started
    assert (label, run_root) == ('dinovim-toy', root)
    assert command == [sys.executable, osp.join(root, 'tools', 'train.py')]
    assert config == str(work / 'configs' / 'dinovim-toy_dino.py')
    cfg = Config.fromfile(config)
    assert cfg.train_dataloader.dataset.data_root == str(tmp_path / 'toy')
    assert cfg.randomness.seed == 1 and cfg.train_cfg.max_epochs == 2
    with open(work / 'recipe.log') as f:
        assert 'toy dataset written to' in f.read()
