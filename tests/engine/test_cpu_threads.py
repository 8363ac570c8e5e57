"""The CPU thread default of the tools."""
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
