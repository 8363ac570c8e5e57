"""InitialWeightsHook: the file holds the weights of the first training step."""
import copy
import os.path as osp
import types

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.engine.hooks import InitialWeightsHook

from tests.helpers.toy_training import tiny_dino_config


class FirstStepWeights(Hook):
    """Copies the state dict the first optimiser step starts from."""
    priority = 'LOWEST'

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == 0:
            self.state = copy.deepcopy(runner.model.state_dict())


@pytest.mark.slow
def test_init_file_is_the_first_steps_weights(tmp_path, toy_data):
    root = toy_data(num_classes=2, train_per_class=4, val_per_class=1, size=32,
                    formats=['imagenet'])
    work = str(tmp_path / 'work')
    cfg = tiny_dino_config(root, work, max_epochs=1, num_workers=0)
    cfg.custom_hooks = list(cfg.custom_hooks) + [dict(type='InitialWeightsHook')]
    runner = Runner.from_cfg(cfg)
    probe = FirstStepWeights()
    runner.register_hook(probe)
    runner.train()
    saved = torch.load(osp.join(work, 'init.pth'), map_location='cpu',
                       weights_only=True)
    assert saved['meta'] == dict(epoch=0, iter=0)
    assert saved['state_dict'].keys() == probe.state.keys()
    for key, value in probe.state.items():
        assert torch.equal(saved['state_dict'][key], value.cpu()), key
    # training moved the student away from it
    final = runner.model.state_dict()
    assert not all(torch.equal(saved['state_dict'][k], final[k].cpu())
                   for k in final if k.startswith('backbone.'))
    # the teacher part is what extract_teacher reads
    assert any(k.startswith('teacher.backbone.') for k in saved['state_dict'])


def test_a_resumed_run_keeps_the_file(tmp_path):
    hook = InitialWeightsHook()
    runner = types.SimpleNamespace(iter=5, work_dir=str(tmp_path), model=None)
    hook.before_train(runner)  # resumed: nothing written, model not touched
    assert not osp.exists(tmp_path / 'init.pth')


@pytest.mark.parametrize('name', ['init.pt', 'sub/init.pth', ''])
def test_bad_filename_raises(name):
    with pytest.raises(ValueError, match='bare'):
        InitialWeightsHook(filename=name)
