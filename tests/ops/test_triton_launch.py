"""The fast Triton launcher: its cache key tells apart exactly what Triton compiles
differently (CPU: the key; CUDA: launches equal Triton's own path)."""
import pytest
import torch

pytest.importorskip('triton')
import triton  # noqa: E402

from mmdinomamba.ops.triton.launch import (Launcher, _arg_key, cdiv,  # noqa: E402
                                           next_power_of_2)


def test_key_follows_tritons_specialisation():
    t = torch.zeros(64)
    # tensors: dtype and 16-byte alignment (a view 1 float in is 4 bytes off)
    assert _arg_key(t, False) == _arg_key(torch.ones(8), False)
    assert _arg_key(t, False) != _arg_key(t[1:], False)
    assert _arg_key(t, False) != _arg_key(t.double(), False)
    # integers: == 1, divisible by 16, 32-bit range
    assert _arg_key(32, False) == _arg_key(48, False)
    assert len({_arg_key(v, False) for v in (1, 16, 17, 2**31, 2**63)}) == 5
    assert _arg_key(3, False) == _arg_key(5, False)
    # constexprs: the value itself
    assert _arg_key(32, True) != _arg_key(48, True)
    assert _arg_key(True, False) != _arg_key(False, False)


def test_host_grid_arithmetic_equals_tritons():
    for n in range(1, 300):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 2, 16, 32, 64, 97):
            assert cdiv(n, d) == triton.cdiv(n, d), (n, d)


class _FakeKernel:
    """What :class:`Launcher` reads of a jitted kernel: names and constexpr indices."""
    arg_names = [f'a{i}' for i in range(11)]
    constexprs = [8, 9]


def test_launcher_key_is_finer_than_the_per_argument_definition():
    """Equal keys must mean one compiled kernel (equal per-argument keys); the key
    may tell apart more (the integers themselves), never less."""
    t = torch.zeros(64)
    launcher = Launcher(_FakeKernel())
    calls = [[t, t[1:], t.double(), 1, 48, 2**40, True, 0.5, None, 7, 2**63],
             [torch.ones(8), t[1:], t.double(), 1, 48, 2**40, True, 0.5, None, 7, 2**63],
             [t, t[4:], t.double(), 1, 48, 2**40, True, 0.5, None, 7, 2**63],
             [t, t[1:], t.double(), 1, 64, 2**40, True, 0.5, None, 7, 2**63],
             [t, t[1:], t.double(), 1, 48, 2**40, True, 0.5, None, 9, 2**63],
             [t, t[1:], t.float(), 1, 48, 2**40, True, 0.5, None, 7, 2**63],
             [t, t[1:], t.double(), True, 48, 2**40, True, 0.5, None, 7, 2**63],
             [t, t[1:], t.double(), 1.0, 48, 2**40, True, 0.5, None, 7, 2**63],
             [t, t[1:], t.double(), 2, 48, 2**40, False, 0.5, None, 7, 2**63],
             [t, t[1:], t.double(), 1, 48, 2**40, True, 0.5, 1, 7, 2**63],
             # a float: by type alone (as Triton), so a new value is the same key
             [t, t[1:], t.double(), 1, 48, 2**40, True, 0.25, None, 7, 2**63],
             # a constexpr by value, a float one too
             [t, t[1:], t.double(), 1, 48, 2**40, True, 0.5, 0.5, 7, 2**63],
             [t, t[1:], t.double(), 1, 48, 2**40, True, 0.5, 0.25, 7, 2**63]]
    keys = [launcher.key(0, v, dict(num_warps=4)) for v in calls]
    defs = [tuple(_arg_key(x, i in _FakeKernel.constexprs) for i, x in enumerate(v))
            for v in calls]
    for a in range(len(calls)):
        for b in range(len(calls)):
            if keys[a] == keys[b]:
                assert defs[a] == defs[b], (a, b)
            if defs[a] != defs[b]:
                assert keys[a] != keys[b], (a, b)
    assert keys[0] == keys[1]  # another aligned float32 tensor: the same kernel
    assert keys[0] != keys[3]  # 48 -> 64: the same kernel, a new key (finer)
    assert keys[10] == keys[0]  # 0.25 for 0.5 (not a constexpr): one kernel, one key
    assert keys[11] != keys[12]  # constexprs 0.5 and 0.25: two kernels
    assert len(set(keys)) == len(keys) - 2
    assert launcher.key(0, calls[0], dict(num_warps=8)) != keys[0]
    assert launcher.key(1, calls[0], dict(num_warps=4)) != keys[0]


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
