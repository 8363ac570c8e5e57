"""Launching a Triton kernel with less host work per call.

``kernel[grid](*args, **kwargs)`` re-derives on every call what the compiled kernel
depends on: it binds the arguments, specialises each one (dtype, 16-byte alignment,
``== 1`` and divisibility by 16 of integers), builds a cache key from them, asks the
driver for the device and stream, then launches. A DinoVim training step makes a
few hundred such launches, and that work is a large part of the host's time per
step. :class:`Launcher` keeps, per kernel, the compiled kernels by a key that is
cheap to build and at least as fine as Triton's (a tensor by its dtype and 16-byte
alignment, every other argument by its value, floats by their type: calls Triton
would compile differently never share a key) and launches a known one directly; an
unknown key goes through Triton's own path once, which compiles if needed (or finds
its own cached kernel) and launches.

Set ``MMDINOMAMBA_TRITON_FAST_LAUNCH=0`` to always take Triton's path; under
Triton's interpreter (``TRITON_INTERPRET=1``) it always is.
"""
import functools
import os
from typing import Dict, Tuple

import torch

Tensor = torch.Tensor

_LAUNCH_OPTIONS = ('num_warps', 'num_stages', 'num_ctas', 'maxnreg')


def fast_launch_enabled() -> bool:
    return (os.environ.get('MMDINOMAMBA_TRITON_FAST_LAUNCH', '1') != '0'
            and os.environ.get('TRITON_INTERPRET', '0') != '1')


def _launch_hooks_set() -> bool:
    """Whether anything (a profiler) hooks Triton's launches: then every launch
    goes through Triton's path, which calls the hooks."""
    runtime = _runtime_knobs()
    if runtime is None:  # a Triton without knobs: no fast path
        return True
    hook = runtime.launch_enter_hook
    # a HookChain (Triton >= 3.5) is never None; it hooks when it holds calls
    return hook is not None and bool(getattr(hook, 'calls', True))


@functools.lru_cache(maxsize=None)
def _runtime_knobs():
    """``triton.knobs.runtime``, or None for a Triton without knobs."""
    try:
        from triton import knobs
    except ImportError:
        return None
    return knobs.runtime


def launch_key(values) -> tuple:
    """The cache key of one call's arguments (in the kernel's order): a tensor by
    its dtype and whether its data is 16-byte aligned, a float by its type (Triton
    does not specialise on float values), a boolean tagged as one (``True == 1``),
    anything else (integers, None, constexprs) by its value, which is finer than
    Triton's integer specialisation (== 1, divisibility by 16, 32-bit range)."""
    return tuple([(v.dtype, v.data_ptr() % 16 == 0) if isinstance(v, Tensor)
                  else float if type(v) is float else (bool, v) if type(v) is bool
                  else v for v in values])


class Launcher:
    """``Launcher(kernel)[grid](*args, **kwargs)`` launches like ``kernel[grid]``.

    Args:
        kernel: a ``@triton.jit`` function.
    """

    # distinct keys kept per kernel (integer arguments vary with the input's shape)
    MAX_KEYS = 4096

    def __init__(self, kernel):
        self.kernel = kernel
        self.names = list(kernel.arg_names)
        self.compiled: Dict[Tuple, object] = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        if _launch_hooks_set():
            return self.kernel[grid](*args, **kwargs)  # a profiler's hooks see every launch
        try:
            values = list(args) + [kwargs[n] for n in self.names[len(args):]]
        except KeyError:  # an argument left to its default: Triton binds it
            return self.kernel[grid](*args, **kwargs)
        device = torch.cuda.current_device()
        key = (device, launch_key(values),
               tuple([kwargs.get(o) for o in _LAUNCH_OPTIONS]))
        kernel = self.compiled.get(key)
        if kernel is None:  # Triton's own path: compiles when needed, launches
            if len(self.compiled) >= self.MAX_KEYS:
                self.compiled.clear()
            self.compiled[key] = self.kernel[grid](*args, **kwargs)
            return self.compiled[key]
        grid = tuple(grid) + (1, 1)
        kernel.run(grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(device),
                   kernel.function, kernel.packed_metadata, None, None, None, *values)
        return kernel


_LAUNCHERS: Dict[object, Launcher] = {}


def launch(kernel):
    """The :class:`Launcher` of ``kernel`` (one per kernel), or the kernel itself when
    the fast path is off: ``launch(k)[grid](...)`` either way."""
    if not fast_launch_enabled():
        return kernel
    launcher = _LAUNCHERS.get(kernel)
    if launcher is None:
        launcher = _LAUNCHERS[kernel] = Launcher(kernel)
    return launcher
