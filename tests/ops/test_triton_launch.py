"""The fast Triton launcher: its cache key tells apart whatever Triton compiles
differently (CPU: the key; CUDA: launches equal Triton's own path)."""
import pytest
import torch

pytest.importorskip('triton')
from mmdinomamba.ops.triton.launch import launch_key  # noqa: E402


def key(value):
    return launch_key([value])


def test_key_tells_apart_what_triton_specialises_on():
    t = torch.zeros(64)
    # tensors: dtype and 16-byte alignment (a view 1 float in is 4 bytes off)
    assert key(t) == key(torch.ones(8))
    assert key(t) != key(t[1:])
    assert key(t) != key(t.double())
    # integers: Triton tells apart == 1, divisible by 16, 32-bit range; the key is
    # the value, finer still
    assert len({key(v) for v in (1, 16, 17, 2**31, 2**63)}) == 5
    assert key(48) == key(48) and key(32) != key(48)
    # booleans are not the integers they equal; floats are not specialised on
    assert key(True) != key(1) and key(False) != key(0) and key(True) != key(False)
    assert key(1e-5) == key(1e-6) and key(1.0) != key(1)
    assert key(None) != key(0)
    # the key of a call is the keys of its arguments, in order
    assert launch_key([t, 16]) != launch_key([16, t])


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_fast_launch_equals_tritons_path(monkeypatch):
    from mmdinomamba.ops.triton.launch import _LAUNCHERS
    from mmdinomamba.ops.triton.norm import add_rms_norm_triton
    h = torch.randn(4, 50, 96, device='cuda')
    r = torch.randn(4, 50, 96, device='cuda')
    w = torch.randn(96, device='cuda')
    monkeypatch.setenv('MMDINOMAMBA_TRITON_FAST_LAUNCH', '0')
    slow = add_rms_norm_triton(h, r, w, 1e-5, torch.float32)
    monkeypatch.setenv('MMDINOMAMBA_TRITON_FAST_LAUNCH', '1')
    first = add_rms_norm_triton(h, r, w, 1e-5, torch.float32)  # through Triton, cached
    sizes = {k: len(v.compiled) for k, v in _LAUNCHERS.items()}
    fast = add_rms_norm_triton(h, r, w, 1e-5, torch.float32)  # launched directly
    assert {k: len(v.compiled) for k, v in _LAUNCHERS.items()} == sizes
    for a, b, c in zip(slow, first, fast):
        assert torch.equal(a, b) and torch.equal(a, c)
