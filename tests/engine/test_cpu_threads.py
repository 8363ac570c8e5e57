"""The CPU thread default of the tools."""
import pytest
import torch

from mmdinomamba.engine import default_cpu_threads, setup_cpu_threads


def test_one_thread_on_cpu_unless_the_user_chose():
    assert default_cpu_threads(cuda=False, env={}) == 1
    assert default_cpu_threads(cuda=False, env={'OMP_NUM_THREADS': '4'}) is None
    assert default_cpu_threads(cuda=True, env={}) is None


def test_setup_sets_the_default(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    try:
        setup_cpu_threads()
        expected = 1 if not torch.cuda.is_available() else before
        assert torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(before)


def test_hook_applies_the_default_before_the_run(monkeypatch):
    from mmdinomamba.engine.hooks import CPUThreadsHook
    before = torch.get_num_threads()
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    try:
        torch.set_num_threads(2)
        CPUThreadsHook().before_run(runner=None)
        assert torch.get_num_threads() == (2 if torch.cuda.is_available() else 1)
        monkeypatch.setenv('OMP_NUM_THREADS', '2')
        torch.set_num_threads(2)
        CPUThreadsHook().before_run(runner=None)
        assert torch.get_num_threads() == 2  # the user's choice stays
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_every_shipped_runner_config_holds_the_hook():
    """Every leaf config that a Runner runs (it has a test loop) lists the hook
    under ``default_hooks``, so upstream tools (mmseg's train.py, ...) apply the
    policy too; the Runner builds it from each package's registry."""
    import glob
    import os
    import os.path as osp

    from mmengine.config import Config
    from mmengine.registry import HOOKS, DefaultScope

    import mmdinomamba  # noqa: F401  (registers our classes)
    from mmdinomamba import zoo
    leaves = [p for p in glob.glob(zoo.config_path('**', '*.py'), recursive=True)
              if '_base_' not in osp.relpath(p, zoo.config_path()).split(os.sep)]
    runs = 0
    for path in sorted(leaves):
        cfg = Config.fromfile(path)
        if not cfg.get('test_cfg') and not cfg.get('train_cfg'):
            continue  # a bare model for the analysis tools
        runs += 1
        assert cfg.default_hooks.cpu_threads == dict(type='CPUThreadsHook'), path
        scope = cfg.get('default_scope', 'mmpretrain')
        with DefaultScope.overwrite_default_scope(scope):
            assert type(HOOKS.build(cfg.default_hooks.cpu_threads)).__name__ == \
                'CPUThreadsHook', path
    assert runs > 50
