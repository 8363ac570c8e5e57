"""CUDAGraphBlocksHook in runs that only test or validate: nothing on a CPU (no
error), inference-only runners with the test bounds on CUDA, a training run's
runners left in place by its validation."""
import pytest
import torch

import mmdinomamba.engine.graphed_blocks as gb
from mmdinomamba.engine.hooks import CUDAGraphBlocksHook
from mmdinomamba.engine.hooks import cuda_graph_hook
from tests.factories import dinovim


def tiny():
    return dinovim(64, 3, img_size=32, patch_size=8, drop_path_rate=0.0,
                   mixer_cfg=dict(d_state=16, headdim=32))


class Runner:
    def __init__(self, model):
        self.model = model
        self.logs = []
        self.logger = type('L', (), {'info': lambda s, msg: self.logs.append(msg),
                                     'warning': lambda s, msg: self.logs.append(msg)})()


@pytest.mark.parametrize('stage', ['before_test', 'before_val'])
def test_testing_on_a_cpu_leaves_the_model_as_it_is(stage):
    model = torch.nn.ModuleDict(dict(backbone=tiny()))
    runner = Runner(model)
    getattr(CUDAGraphBlocksHook(), stage)(runner)
    assert model['backbone'].stack_runner is None and runner.logs == []


@pytest.mark.parametrize('stage', ['before_test', 'before_val'])
def test_testing_on_cuda_sets_inference_runners_with_the_test_bounds(stage, monkeypatch):
    monkeypatch.setattr(cuda_graph_hook, 'on_cuda', lambda model: True)
    model = torch.nn.ModuleDict(dict(backbone=tiny()))
    runner = Runner(model)
    hook = CUDAGraphBlocksHook(test_max_signatures=5, test_capture_after=3)
    getattr(hook, stage)(runner)
    blocks = model['backbone'].stack_runner.graphs
    assert (blocks.training, blocks.evict, blocks.max_signatures,
            blocks.capture_after) == (False, True, 5, 3)
    assert '`backbone`' in runner.logs[0]
    # defaults
    model = tiny()
    getattr(CUDAGraphBlocksHook(), stage)(Runner(model))
    blocks = model.stack_runner.graphs
    assert (blocks.training, blocks.max_signatures, blocks.capture_after) == (
        False, cuda_graph_hook.TEST_MAX_SIGNATURES, cuda_graph_hook.TEST_CAPTURE_AFTER)
    # test=False: left eager
    model = tiny()
    getattr(CUDAGraphBlocksHook(test=False), stage)(Runner(model))
    assert model.stack_runner is None


def test_a_training_run_keeps_its_runners_through_validation(monkeypatch):
    monkeypatch.setattr(cuda_graph_hook, 'on_cuda', lambda model: True)
    model = tiny()
    hook = CUDAGraphBlocksHook(max_signatures=3)
    hook.before_train(Runner(model))
    runner_before = model.stack_runner
    hook.before_val(Runner(model))
    assert model.stack_runner is runner_before
    blocks = runner_before.graphs
    assert (blocks.training, blocks.evict, blocks.max_signatures) == (True, False, 3)
    # train=False: inference runners from the start, with the test bounds
    model = tiny()
    CUDAGraphBlocksHook(train=False).before_train(Runner(model))
    assert model.stack_runner.graphs.training is False
    assert model.stack_runner.graphs.max_signatures == cuda_graph_hook.TEST_MAX_SIGNATURES


def test_a_model_without_runners_gets_one_logged_line(monkeypatch):
    monkeypatch.setattr(cuda_graph_hook, 'on_cuda', lambda model: True)
    runner = Runner(torch.nn.Linear(2, 2))
    CUDAGraphBlocksHook().before_test(runner)
    assert len(runner.logs) == 1 and 'no module of the model (Linear)' in runner.logs[0]


@pytest.mark.parametrize('kwargs, match', [
    (dict(test_max_signatures=0), 'test_max_signatures must be a positive int'),
    (dict(test_capture_after=1.0), 'test_capture_after must be a positive int'),
    (dict(max_signatures=True), 'max_signatures must be a positive int'),
    (dict(train='no'), 'train must be True or False'),
    (dict(test=1), 'test must be True or False')])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CUDAGraphBlocksHook(**kwargs)


def test_on_cuda_reads_the_parameters():
    assert not gb.on_cuda(torch.nn.Linear(2, 2))
    assert not gb.on_cuda(torch.nn.ReLU())  # no parameters


@pytest.mark.gpu
def test_on_cuda_reads_the_parameters_on_a_gpu():
    assert gb.on_cuda(torch.nn.Linear(2, 2).cuda())


@pytest.mark.parametrize('cuda', [False, True])
def test_runner_test_calls_the_hook_before_testing(cuda, toy_root, tmp_path, monkeypatch):
    """A real ``Runner.test()`` of the toy linear probe with the hook: mmengine
    calls ``before_test``; on a CPU the model stays eager; with CUDA claimed (the
    check faked), the inference runners are set before the first batch (they run
    eagerly on CPU tensors) and the metrics are the eager run's."""
    from mmengine.hooks import Hook
    from mmengine.runner import Runner
    from tests.helpers.toy_training import tiny_probe_config

    seen = []

    class Record(Hook):
        priority = 'LOWEST'

        def before_test_iter(self, runner, batch_idx, data_batch=None):
            seen.append(runner.model.backbone.stack_runner)

    def metrics(work_dir, hooked):
        cfg = tiny_probe_config(toy_root, str(tmp_path / work_dir))
        cfg.test_dataloader.dataset.pipeline = cfg.val_dataloader.dataset.pipeline[:-2] \
            + cfg.val_dataloader.dataset.pipeline[-1:]  # no random flip
        cfg.custom_hooks = [dict(type='CUDAGraphBlocksHook')] if hooked else []
        torch.manual_seed(0)
        runner = Runner.from_cfg(cfg)
        runner.register_hook(Record())
        return runner.test()

    if cuda:
        monkeypatch.setattr(cuda_graph_hook, 'on_cuda', lambda model: True)
    got = metrics('hooked', True)
    assert seen and all(isinstance(r, gb.GraphedStack) == cuda for r in seen)
    assert all(r.graphs.training is False for r in seen if r is not None)
    assert got == metrics('eager', False)
