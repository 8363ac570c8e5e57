"""Launching a Triton kernel with less host work per call.

``kernel[grid](*args, **kwargs)`` re-derives on every call what the compiled kernel
depends on: it binds the arguments, specialises each one (dtype, 16-byte alignment,
``== 1`` and divisibility by 16 of integers), builds a cache key from them, asks the
driver for the device and stream, then launches. A DinoVim training step makes a
few hundred such launches, and that work is a large part of the host's time per
step. :class:`Launcher` keeps, per kernel, the compiled kernels by a key computed
from the arguments (tensors by dtype and alignment), which tells apart at least the
calls that Triton would compile differently, and launches a known one directly; an
unknown key goes through Triton's own path once, which compiles if needed and
launches.

Set ``MMDINOMAMBA_TRITON_FAST_LAUNCH=0`` to always take Triton's path; under
Triton's interpreter (``TRITON_INTERPRET=1``) it always is.

Supported Triton versions: :data:`TRITON_VERSIONS`. The direct launch calls the
compiled kernel's ``run`` as ``JITFunction.run`` does, a private interface of
Triton; for a Triton outside that range every launch takes Triton's own path (the
same results, more host time). ``tests/ops/test_triton_launch.py`` checks the
installed Triton's ``JITFunction.run`` still makes that call.

Why it stays (measured with ``benchmarks/benchmark.py --device cpu host --launch fast
triton``; figures in ``benchmarks/README.md``): graph replay (``CUDAGraphBlocksHook``)
and ``torch.compile`` take the launches off the host for the DINO configs, but every
eager call (inference, linear probing, analysis, the dense fine-tuning configs)
still issues its launches one by one, and through Triton's own path an eager
DinoVim-B training step costs the host 9-17 % more (240 launches; 28 Python calls
more per launch).

Inside :func:`mmdinomamba.ops.spec.skip_kernels` (a dry run, to measure the host's
work) :func:`launch` hands out launchers that do the same work but for the driver's
calls: the device and stream are 0 and every launch runs a stand-in that counts it.
"""
import os
from functools import partial
from operator import attrgetter, itemgetter
from typing import Callable, Dict, List, Tuple

import torch

from ..spec import DryRun, dry_run

Tensor = torch.Tensor

_LAUNCH_OPTIONS = ('num_warps', 'num_stages', 'num_ctas', 'maxnreg')


# Host-side grid arithmetic. ``triton.cdiv`` and ``triton.next_power_of_2`` are
# constexpr functions, callable from kernels: a host call unwraps its arguments
# through Triton's machinery, about 2 us, several times per mixer call.
def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints (``triton.cdiv`` on the host)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n >= 1 (``triton.next_power_of_2`` on the
    host)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t.to(dtype)``, without an operator call when ``t`` already has ``dtype``: a
    no-op ``to`` still goes through the dispatcher, and an eager step's host time
    follows the operators it issues (``benchmarks/README.md``, host mode)."""
    return t if t.dtype == dtype else t.to(dtype)


# Triton reads it when a kernel is decorated, so once per process is enough here too
_INTERPRET = os.environ.get('TRITON_INTERPRET', '0') == '1'
_FAST_LAUNCH = None  # MMDINOMAMBA_TRITON_FAST_LAUNCH, read on the first launch

# The Triton versions whose launch path Launcher repeats, [first, last excluded):
# run on a GPU with 3.6, the call read in 3.8's source by the CPU tests
TRITON_VERSIONS = ((3, 6), (3, 9))


def triton_version_supported(version: str) -> bool:
    """Whether a Triton version string (``'3.6.0'``, ``'3.8.0+git1a2b'``) is in
    :data:`TRITON_VERSIONS`."""
    try:
        major, minor = (int(p) for p in version.split('.')[:2])
    except ValueError:  # not 'X.Y...': unknown, so not supported
        return False
    return TRITON_VERSIONS[0] <= (major, minor) < TRITON_VERSIONS[1]


def _installed_triton_supported() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return triton_version_supported(triton.__version__)


def fast_launch_enabled() -> bool:
    """Whether :func:`launch` takes the fast path: ``MMDINOMAMBA_TRITON_FAST_LAUNCH``
    as it was at the first launch (:func:`reread_environment` reads it again), a
    Triton of :data:`TRITON_VERSIONS`, and never under Triton's interpreter."""
    global _FAST_LAUNCH
    if _FAST_LAUNCH is None:
        _FAST_LAUNCH = (os.environ.get('MMDINOMAMBA_TRITON_FAST_LAUNCH', '1') != '0'
                        and not _INTERPRET and _installed_triton_supported())
    return _FAST_LAUNCH


def reread_environment() -> None:
    """Read ``MMDINOMAMBA_TRITON_FAST_LAUNCH`` again at the next launch (an
    environment lookup per launch costs about as much as the key)."""
    global _FAST_LAUNCH
    _FAST_LAUNCH = None


try:
    from triton import knobs as _knobs
except ImportError:  # a Triton without knobs (or none): no fast path
    _knobs = None


def _launch_hooks_set() -> bool:
    """Whether anything (a profiler) hooks Triton's launches: then every launch
    goes through Triton's path, which calls the hooks."""
    if _knobs is None:
        return True
    hook = _knobs.runtime.launch_enter_hook
    # a HookChain (Triton >= 3.5) is never None; it hooks when it holds calls
    return hook is not None and bool(getattr(hook, 'calls', True))


_I32 = 2**31


def _arg_key(value, constexpr: bool):
    """What Triton specialises a kernel on for one argument (the slow twin of the
    loop in :meth:`Launcher.key`, which must agree with it)."""
    if constexpr:
        return value
    if isinstance(value, Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return type(value), value if isinstance(value, bool) else None
    if isinstance(value, int):
        return (value == 1, value % 16 == 0, -_I32 <= value < _I32, value >= 2**63)
    return type(value), value


def _picker(indices: List[int]) -> Callable[[list], tuple]:
    """``values -> tuple(values[i] for i in indices)``, in C where it can be."""
    if len(indices) == 1:
        i = indices[0]
        return lambda values: (values[i], )
    return itemgetter(*indices) if indices else (lambda values: ())


_DTYPE = attrgetter('dtype')
_DATA_PTR = Tensor.data_ptr
_MOD16 = (16).__rmod__  # p -> p % 16, in C


class Launcher:
    """``Launcher(kernel)[grid](*args, **kwargs)`` launches like ``kernel[grid]``.

    Args:
        kernel: a ``@triton.jit`` function.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.names = list(kernel.arg_names)
        self.constexpr = [i in set(kernel.constexprs) for i in range(len(self.names))]
        self.compiled: Dict[Tuple, object] = {}
        # per tuple of argument types: which arguments the key holds as they are
        # and which are tensors (see :meth:`key`)
        self._pickers: Dict[Tuple[type, ...], Tuple[Callable, Callable]] = {}

    def __getitem__(self, grid):
        return partial(self.launch, grid)

    def _pick(self, types: Tuple[type, ...]) -> Tuple[Callable, Callable]:
        """The pickers of the arguments kept by value (constexprs, and the rest but
        tensors and floats) and of the tensors, for arguments of these types."""
        kept = [i for i, (t, c) in enumerate(zip(types, self.constexpr))
                if c or (t is not float and not issubclass(t, Tensor))]
        tensors = [i for i, (t, c) in enumerate(zip(types, self.constexpr))
                   if not c and issubclass(t, Tensor)]
        pickers = self._pickers[types] = (_picker(kept), _picker(tensors))
        return pickers

    def key(self, device: int, values: list, kwargs: dict) -> tuple:
        """The compiled kernel's key: the arguments' types, the arguments
        themselves (constexprs by value; tensors by their dtype and address modulo
        16, which tells 16-byte aligned ones apart; floats by type alone, as
        Triton specialises them, so the cache stays bounded) and the launch
        options. Finer than Triton's specialisation
        (:func:`_arg_key`: integers by ``== 1``, divisibility by 16 and range), so
        calls with one key compile alike; a new integer (a new shape) costs one trip
        through Triton's path, which finds the compiled kernel.

        Which argument is read how depends on the types alone, so that is worked
        out once per tuple of types; a call then picks and maps in C (a Python
        call per argument would cost as much as the launch itself)."""
        types = tuple(map(type, values))  # True == 1 == 1.0: the types tell apart
        pickers = self._pickers.get(types) or self._pick(types)
        tensors = pickers[1](values)
        return (device, types, *pickers[0](values), *map(_DTYPE, tensors),
                *map(_MOD16, map(_DATA_PTR, tensors)), *map(kwargs.get, _LAUNCH_OPTIONS))

    def launch(self, grid, *args, **kwargs):
        if _launch_hooks_set():
            return self.kernel[grid](*args, **kwargs)  # a profiler's hooks see every launch
        try:
            values = [*args, *map(kwargs.__getitem__, self.names[len(args):])]
        except KeyError:  # an argument left to its default: Triton binds it
            return self.kernel[grid](*args, **kwargs)
        device = torch._C._cuda_getDevice()
        key = self.key(device, values, kwargs)
        kernel = self.compiled.get(key)
        if kernel is None:  # Triton's own path: compiles when needed, launches
            self.compiled[key] = self.kernel[grid](*args, **kwargs)
            return self.compiled[key]
        grid = tuple(grid) + (1, 1)
        kernel.run(grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(device),
                   kernel.function, kernel.packed_metadata, None, None, None, *values)
        return kernel


class _SkippedKernel:
    """What a dry run's launcher keeps as the compiled kernel: running it counts."""
    function = packed_metadata = None

    def __init__(self, dry: DryRun):
        self.dry = dry

    def run(self, *args) -> None:
        self.dry.launches += 1


class _DryLauncher(Launcher):
    """:meth:`Launcher.launch` less the driver: the arguments and the key as on CUDA
    (device 0), then a launch of :class:`_SkippedKernel` (stream 0)."""

    def __init__(self, kernel, dry: DryRun):
        super().__init__(kernel)
        self.skipped = _SkippedKernel(dry)

    def launch(self, grid, *args, **kwargs):
        values = [*args, *map(kwargs.__getitem__, self.names[len(args):])]
        key = self.key(0, values, kwargs)
        kernel = self.compiled.setdefault(key, self.skipped)
        grid = tuple(grid) + (1, 1)
        kernel.run(grid[0], grid[1], grid[2], 0, kernel.function, kernel.packed_metadata,
                   None, None, None, *values)
        return kernel


# by the kernel's id: a JITFunction hashes by its source's cache key, through a lock
_LAUNCHERS: Dict[int, Launcher] = {}


def launch(kernel):
    """The :class:`Launcher` of ``kernel`` (one per kernel), or the kernel itself when
    the fast path is off: ``launch(k)[grid](...)`` either way. In a dry run, the
    dry run's own launcher of ``kernel`` (with the fast path off, the kernel itself:
    Triton's path, which then needs a driver of the caller's, e.g. a stand-in set
    with ``triton.runtime.driver.set_active``)."""
    if not fast_launch_enabled():
        return kernel
    dry = dry_run()
    if dry is not None:
        launcher = dry.launchers.get(id(kernel))
        if launcher is None:
            launcher = dry.launchers[id(kernel)] = _DryLauncher(kernel, dry)
        return launcher
    launcher = _LAUNCHERS.get(id(kernel))
    if launcher is None or launcher.kernel is not kernel:  # new, or an id reused
        launcher = _LAUNCHERS[id(kernel)] = Launcher(kernel)
    return launcher
