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


@pytest.mark.gpu
def test_fast_launch_equals_tritons_path(monkeypatch):
    from mmdinomamba.ops.triton.launch import _LAUNCHERS, reread_environment
    from mmdinomamba.ops.triton.norm import add_rms_norm_triton
    h = torch.randn(4, 50, 96, device='cuda')
    r = torch.randn(4, 50, 96, device='cuda')
    w = torch.randn(96, device='cuda')
    monkeypatch.setenv('MMDINOMAMBA_TRITON_FAST_LAUNCH', '0')
    reread_environment()
    slow = add_rms_norm_triton(h, r, w, 1e-5, torch.float32)
    monkeypatch.setenv('MMDINOMAMBA_TRITON_FAST_LAUNCH', '1')
    reread_environment()
    first = add_rms_norm_triton(h, r, w, 1e-5, torch.float32)  # through Triton, cached
    sizes = {k: len(v.compiled) for k, v in _LAUNCHERS.items()}
    fast = add_rms_norm_triton(h, r, w, 1e-5, torch.float32)  # launched directly
    assert {k: len(v.compiled) for k, v in _LAUNCHERS.items()} == sizes
    for a, b, c in zip(slow, first, fast):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_fast_launch_setting_is_read_at_the_first_launch(monkeypatch):
    from mmdinomamba.ops.triton import launch as launch_module
    kernel = _FakeKernel()
    monkeypatch.setenv('MMDINOMAMBA_TRITON_FAST_LAUNCH', '0')
    launch_module.reread_environment()
    try:
        assert launch_module.launch(kernel) is kernel
        monkeypatch.setenv('MMDINOMAMBA_TRITON_FAST_LAUNCH', '1')
        assert launch_module.launch(kernel) is kernel  # not read again
        launch_module.reread_environment()
        fast = launch_module.launch(kernel)
        if launch_module._INTERPRET:  # the interpreter always takes Triton's path
            assert fast is kernel
        else:
            assert isinstance(fast, Launcher) and fast.kernel is kernel
            assert launch_module.launch(kernel) is fast  # one launcher per kernel
    finally:
        launch_module._LAUNCHERS.pop(id(kernel), None)
        launch_module.reread_environment()


def test_row_align_is_the_largest_power_of_two_dividing_every_stride():
    from mmdinomamba.ops.triton.conv import row_align
    for element_size in (1, 2, 4, 8):
        for strides in [(), (0, ), (768, ), (3, 64), (96, 40, 1032), (24, 8), (6, )]:
            naive = 16 // element_size
            while naive > 1 and any(s % naive for s in strides):
                naive //= 2
            assert row_align(element_size, *strides) == naive, (element_size, strides)


def test_stride_arguments_are_named_by_tensor_and_axis():
    from mmdinomamba.ops.triton.ssd_common import strides
    x = torch.zeros(2, 5, 2, 3, 4)[:, :, :, 1:]
    assert strides('x', x) == dict(s_xb=120, s_xl=24, s_xd=12, s_xh=4)
    assert strides('B', x, 'g') == dict(s_Bb=120, s_Bl=24, s_Bd=12, s_Bg=4)
    assert strides('t', torch.zeros(2, 5, 3)) == dict(s_tb=15, s_tl=3, s_th=1)
    assert strides('x', x) == dict(s_xb=120, s_xl=24, s_xd=12, s_xh=4)  # cached names


def test_cast_skips_the_operator_when_the_dtype_is_already_right():
    from mmdinomamba.ops.triton.launch import cast
    t = torch.randn(3)
    assert cast(t, torch.float32) is t
    half = cast(t, torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half, t.to(torch.float16))


def test_fast_launch_only_for_the_pinned_triton_versions():
    from mmdinomamba.ops.triton.launch import TRITON_VERSIONS, triton_version_supported
    assert TRITON_VERSIONS == ((3, 6), (3, 9))
    for version, supported in [('3.5.1', False), ('3.6.0', True), ('3.7.1', True),
                               ('3.8.0+git1a2b3c', True), ('3.9.0', False),
                               ('4.0.0', False), ('2.3.1', False), ('main', False)]:
        assert triton_version_supported(version) is supported, version


def test_tritons_launch_call_is_the_one_the_launcher_repeats(monkeypatch):
    """The launcher calls a compiled kernel's ``run`` with the arguments
    ``JITFunction.run`` passes it, and reads a kernel's ``arg_names`` and
    ``constexprs``. For the installed Triton, in the pinned range, that call is still
    in ``JITFunction.run`` and our kernels have those attributes as the launcher
    reads them; outside it, the fast path is off."""
    import inspect
    import re

    from triton.runtime.jit import JITFunction

    from mmdinomamba.ops.triton import launch as launch_module
    from mmdinomamba.ops.triton.ssd_fwd import _ssd_fwd_kernel
    monkeypatch.delenv('MMDINOMAMBA_TRITON_FAST_LAUNCH', raising=False)
    launch_module.reread_environment()
    try:
        enabled = launch_module.fast_launch_enabled()
    finally:
        launch_module.reread_environment()
    if not launch_module.triton_version_supported(triton.__version__):
        assert not enabled
        return
    assert enabled is not launch_module._INTERPRET
    source = re.sub(r'\s+', ' ', inspect.getsource(JITFunction.run))
    assert ('kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, '
            'kernel.packed_metadata, launch_metadata, knobs.runtime.launch_enter_hook, '
            'knobs.runtime.launch_exit_hook, *bound_args.values())') in source
    params = list(inspect.signature(_ssd_fwd_kernel.fn).parameters)
    assert list(_ssd_fwd_kernel.arg_names) == params
    assert sorted(_ssd_fwd_kernel.constexprs) == [
        i for i, name in enumerate(params)
        if _ssd_fwd_kernel.fn.__annotations__.get(name) is not None
        and 'constexpr' in str(_ssd_fwd_kernel.fn.__annotations__[name])]
