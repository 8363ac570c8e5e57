"""Triton's own launch path in a dry run, through Triton's PRIVATE internals.

The host mode's ``--launch triton`` compares the package's fast launcher
(``mmdinomamba/ops/triton/launch.py``) with Triton's own ``kernel[grid](...)``
path on a CPU. To run Triton's path without a GPU, this file swaps Triton's
active driver (``triton.runtime.driver.set_active`` and ``driver._active``) and
writes stand-in kernels into a JIT function's cache
(``jit_function.device_caches``) from the ``knobs.runtime.jit_cache_hook``.
None of these is public API: a Triton release may rename or reshape them, and
then only this file (and ``--launch triton``) breaks. Nothing else in the
repository touches them.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

@contextlib.contextmanager
def tritons_own_launches(dry) -> Iterator[None]:
    """Inside a dry run (:func:`mmdinomamba.ops.skip_kernels`), launch the kernels
    through Triton's own path (``kernel[grid](...)``: binding, specialisation, cache
    key, launch metadata) instead of the fast launcher
    (``mmdinomamba/ops/triton/launch.py``), on any machine.

    Through Triton's extension points: its active driver is a stand-in (device 0,
    stream 0, an sm_90 target), and where Triton would compile, its
    ``jit_cache_hook`` puts a stand-in kernel in the cache that counts its launches
    into ``dry.launches`` (the first call of each specialisation compiles nothing
    and launches nothing); the stand-ins leave the caches at the end. The fast
    launcher is off meanwhile (``MMDINOMAMBA_TRITON_FAST_LAUNCH=0``)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    from mmdinomamba.ops.triton import launch

    class Driver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget('cuda', 90, 32)

    class Kernel:
        function = packed_metadata = None

        def launch_metadata(self, grid, stream, *args):
            return None

        def run(self, *args):
            dry.launches += 1

    installed = []  # (the kernel cache, the key) of every stand-in

    def compile_hook(*args, **kwargs) -> bool:
        cache = kwargs['fn'].jit_function.device_caches[0][0]
        cache[kwargs['key']] = Kernel()
        installed.append((cache, kwargs['key']))
        return True  # compiled: nothing left to do

    env = os.environ.get('MMDINOMAMBA_TRITON_FAST_LAUNCH')
    hook = knobs.runtime.jit_cache_hook
    active = driver._active  # None until Triton first asks for a driver (no GPU: none)
    os.environ['MMDINOMAMBA_TRITON_FAST_LAUNCH'] = '0'
    launch.reread_environment()
    driver.set_active(Driver())
    knobs.runtime.jit_cache_hook = compile_hook
    try:
        yield
    finally:
        for cache, key in installed:
            cache.pop(key, None)
        knobs.runtime.jit_cache_hook = hook
        driver.set_active(active)
        if env is None:
            os.environ.pop('MMDINOMAMBA_TRITON_FAST_LAUNCH')
        else:
            os.environ['MMDINOMAMBA_TRITON_FAST_LAUNCH'] = env
        launch.reread_environment()
