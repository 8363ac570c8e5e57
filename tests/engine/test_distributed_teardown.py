"""teardown_distributed: a no-op without a process group, else barrier + destroy."""
import torch.distributed as torch_dist

from mmdinomamba.engine import teardown_distributed


def test_teardown_without_a_group_does_nothing():
    assert not torch_dist.is_initialized()
    teardown_distributed()
    assert not torch_dist.is_initialized()


def test_teardown_destroys_the_group(tmp_path):
    store = torch_dist.FileStore(str(tmp_path / 'store'), 1)
    torch_dist.init_process_group('gloo', store=store, rank=0, world_size=1)
    assert torch_dist.is_initialized()
    teardown_distributed()
    assert not torch_dist.is_initialized()
