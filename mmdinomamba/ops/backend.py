"""Which implementation runs: the PyTorch references or the fused Triton kernels.

The rules, written here alone:

* The Triton kernels (:mod:`mmdinomamba.ops.triton`) take CUDA tensors of a
  :data:`~mmdinomamba.ops.spec.TRITON_DTYPES` dtype when CUDA is usable and Triton
  imports (:func:`triton_available`, :func:`triton_takes`). Everything else (CPU,
  float64, no Triton) takes the PyTorch path, which is the ground truth. The
  environment variable ``MMDINOMAMBA_DISABLE_TRITON=1`` forces the PyTorch path on
  CUDA too.
* Under ``torch.compile`` the PyTorch ops run (Inductor fuses them itself,
  :func:`use_triton`), but for the mixer core, which it cannot write as one kernel:
  that stays fused, as a custom op (:func:`uses_fused_core`).
* The SSD alone has named backends (:data:`BACKENDS`); :func:`resolve_backend`
  turns a name, ``'auto'`` included, into the one that runs.
* Inside :func:`mmdinomamba.ops.spec.skip_kernels` (a dry run for measuring the
  host's work) every device takes the fused path and no kernel runs.

The dispatchers of the single ops, after checking their inputs, are here too:
:func:`ssd_scan` (the SSD), :func:`add_rms_norm` (a block's pre-norm step) and
:func:`add_layer_norm` (a residual add + LayerNorm). The
composite ops, whose PyTorch twins call these dispatchers step by step, apply the
rules in their own modules: :func:`mmdinomamba.ops.mixer.mixer_core`
(:func:`uses_fused_core`) and :func:`mmdinomamba.ops.blocks.run_blocks`
(:func:`uses_fused_blocks`).

Input checks. :func:`check_ssd_inputs` rejects a non-finite ``dt`` through
:func:`check_finite`, which the mixers and backbones also call on their inputs.
That test reads a value back from the device, so on CUDA it runs only when the
environment variable ``MMDINOMAMBA_CHECK_FINITE=1`` is set (on the CPU it always
runs).
"""
import functools
import importlib.util
import os
import warnings
from typing import Optional, Sequence, Tuple, Union

import torch
from mmengine.logging import print_log

from .norm import add_layer_norm_ref, add_rms_norm_ref, layer_norm_out_dtype
from .spec import (CHUNK_SIZE, TRITON_DTYPES, BlockSpec, MixerSpec, check_chunk_size,
                   compute_dtype, dry_run, note_chunk_size_unused, resolve_chunk_size)
from .ssd import SSDOutput, ssd_chunked, ssd_quadratic, ssd_ref

Tensor = torch.Tensor

BACKENDS = ('auto', 'chunked', 'quadratic', 'ref', 'triton', 'mamba_ssm')
# 'quadratic' warns when the mixing matrices of one call would hold more than this
QUADRATIC_WARN_BYTES = 2**30
# 'quadratic' refuses longer sequences. Its time grows with the square of the length:
# one call (batch 1, the toy DinoVim's 8 heads of 16 channels, state 16, one CPU
# thread) takes 0.95 s at 1024 tokens, 3.7 s at 2048 and 13 s at 4096, where
# 'chunked' takes 0.11 / 0.29 / 0.24 s (benchmarks/results/ssd_quadratic_length.csv,
# `python benchmarks/ssd_quadratic_length.py`). A toy DinoVim makes 8 calls per
# image (4 blocks, 2 directions): a batch of 8 at 1024 tokens takes about a minute,
# at 2048 several minutes.
QUADRATIC_MAX_SEQLEN = 1024


# --------------------------------------------------------------------------- #
# Where the kernels run
# --------------------------------------------------------------------------- #
@functools.lru_cache(maxsize=None)
def _triton_imports() -> bool:
    """Whether the kernels' package imports (Triton installed, not too old) and is not
    disabled by ``MMDINOMAMBA_DISABLE_TRITON=1``."""
    if os.environ.get('MMDINOMAMBA_DISABLE_TRITON', '0') == '1':
        return False
    if importlib.util.find_spec('triton') is None:
        return False
    try:
        import mmdinomamba.ops.triton  # noqa: F401
    except Exception:  # a Triton too old for the kernels, or a broken install
        return False
    return True


@functools.lru_cache(maxsize=None)
def _triton_usable() -> bool:
    return torch.cuda.is_available() and _triton_imports()


@torch.compiler.assume_constant_result  # torch.compile reads it once, no graph break
def triton_available() -> bool:
    """True when CUDA is usable, Triton imports and it is not disabled."""
    return _triton_usable()


def _kernel_device(device: torch.device) -> bool:
    """Whether the kernels run on ``device``: CUDA where :func:`triton_available`;
    any device during a dry run (:func:`~mmdinomamba.ops.spec.skip_kernels`) where
    the kernels' package imports."""
    if dry_run() is not None:
        return _triton_imports()
    return device.type == 'cuda' and triton_available()


def triton_takes(t: Tensor) -> bool:
    """Whether the kernels can take tensor ``t``: a Triton dtype on a device where
    they run (:func:`_kernel_device`)."""
    return t.dtype in TRITON_DTYPES and _kernel_device(t.device)


def use_triton(t: Tensor) -> bool:
    """Whether the fused kernels take tensor ``t`` (:func:`triton_takes`). Never under
    ``torch.compile``, which fuses the PyTorch ops itself; only the mixer core, which
    it cannot write as one kernel, stays fused there (a custom op:
    :func:`uses_fused_core`)."""
    return not torch.compiler.is_compiling() and triton_takes(t)


def uses_fused_core(zxbcdt: Tensor, spec: MixerSpec) -> bool:
    """Whether :func:`mmdinomamba.ops.mixer.mixer_core` takes the fused Triton path
    for this input: a device where the kernels run, a Triton dtype, ``d_conv = 4``
    and an SSD backend of 'auto' or 'triton'.

    Under ``torch.compile`` too: there the kernels run as the custom ops of
    :mod:`mmdinomamba.ops.triton.mixer`, one node of the graph each.
    """
    if spec.ssd_backend not in ('auto', 'triton') or spec.d_conv != 4:
        return False
    if not triton_takes(zxbcdt):
        return False
    return resolve_backend(spec.ssd_backend, zxbcdt.device) == 'triton'


def uses_fused_blocks(tokens: Tensor, specs: Sequence[BlockSpec]) -> bool:
    """Whether :func:`mmdinomamba.ops.blocks.run_blocks` takes the fused path: the
    add + norm's kernels take ``tokens`` (:func:`use_triton`: not under
    ``torch.compile``) and every mixer takes its fused core."""
    return use_triton(tokens) and all(uses_fused_core(tokens, s.mixer) for s in specs)


# --------------------------------------------------------------------------- #
# The SSD's backends
# --------------------------------------------------------------------------- #
def _mamba_ssm_scan():
    """mamba-ssm's fused Triton scan, or None when it cannot be imported."""
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception:  # ImportError, or its CUDA extensions failing to load
        return None
    return mamba_chunk_scan_combined


def mamba_ssm_available() -> bool:
    return _mamba_ssm_scan() is not None


_LOGGED = set()


def resolve_backend(backend: str, device: torch.device, needs_states: bool = False,
                    dtype: Optional[torch.dtype] = None) -> str:
    """Turn ``'auto'`` into a concrete backend for tensors on ``device``.

    ``'auto'`` picks ``'triton'`` where the kernels run (CUDA when Triton imports)
    unless ``needs_states`` (initial or final states are asked for), else
    ``'mamba_ssm'`` on CUDA when mamba-ssm imports, otherwise ``'chunked'``; where it
    would pick ``'triton'`` for a ``dtype`` the kernels do not take (float64),
    ``'chunked'``. The choice is logged once per (request, device type).
    """
    if backend not in BACKENDS:
        raise ValueError(f'ssd: unknown backend {backend!r}; '
                         f'choose one of {BACKENDS}')
    cuda = device.type == 'cuda'
    kernels = _kernel_device(device)
    chosen = backend
    if backend == 'auto':
        if kernels and not needs_states:
            chosen = 'triton' if dtype is None or dtype in TRITON_DTYPES else 'chunked'
        elif cuda and mamba_ssm_available():
            chosen = 'mamba_ssm'
        else:
            chosen = 'chunked'
    if chosen == 'triton' and needs_states:
        raise ValueError('ssd: backend "triton" has no `initial_states` / '
                         '`return_final_states`; use "chunked", "ref" or "mamba_ssm"')
    if chosen == 'mamba_ssm' and not (cuda and mamba_ssm_available()):
        raise ValueError('ssd: backend "mamba_ssm" needs CUDA tensors and an '
                         'importable mamba-ssm (pip install mmdinomamba[mamba])')
    if chosen == 'triton' and not kernels:
        raise ValueError('ssd: backend "triton" needs CUDA tensors and an '
                         'importable Triton')
    key = (backend, device.type, chosen)
    if key not in _LOGGED and not torch.compiler.is_compiling():  # no graph break
        _LOGGED.add(key)
        print_log(f'SSD backend: requested {backend!r} on {device.type}, '
                  f'using {chosen!r}', logger='current')
    return chosen


# --------------------------------------------------------------------------- #
# Input checks
# --------------------------------------------------------------------------- #
def _shape_error(name: str, expected: str, got: Tensor) -> ValueError:
    return ValueError(f'ssd: `{name}` must have shape {expected}, '
                      f'got {tuple(got.shape)}')


def check_ssd_inputs(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                     D: Optional[Tensor] = None, z: Optional[Tensor] = None,
                     dt_bias: Optional[Tensor] = None,
                     initial_states: Optional[Tensor] = None,
                     chunk_size: Union[int, str] = CHUNK_SIZE) -> None:
    """Raise a ValueError naming the first argument with a wrong shape.

    Also rejects a non-finite ``dt`` (it would silently poison the scan):
    :func:`check_finite`.
    """
    if x.dim() != 4:
        raise _shape_error('x', '(batch, seqlen, nheads, headdim)', x)
    batch, seqlen, nheads, headdim = x.shape
    if dt.shape != (batch, seqlen, nheads):
        raise _shape_error('dt', f'(batch, seqlen, nheads) = '
                           f'{(batch, seqlen, nheads)}', dt)
    if A.shape != (nheads, ):
        raise _shape_error('A', f'(nheads,) = {(nheads, )}', A)
    if B.dim() != 4 or B.shape[:2] != (batch, seqlen):
        raise _shape_error('B', f'(batch, seqlen, ngroups, dstate) with '
                           f'batch, seqlen = {(batch, seqlen)}', B)
    ngroups, dstate = B.shape[2:]
    if nheads % ngroups != 0:
        raise ValueError(f'ssd: ngroups ({ngroups}, from `B`) must divide '
                         f'nheads ({nheads}, from `x`)')
    if C.shape != B.shape:
        raise _shape_error('C', f'the shape of B = {tuple(B.shape)}', C)
    if D is not None and D.shape not in ((nheads, ), (nheads, headdim)):
        raise _shape_error('D', f'(nheads,) or (nheads, headdim) = '
                           f'{(nheads, )} or {(nheads, headdim)}', D)
    if z is not None and z.shape != x.shape:
        raise _shape_error('z', f'the shape of x = {tuple(x.shape)}', z)
    if dt_bias is not None and dt_bias.shape != (nheads, ):
        raise _shape_error('dt_bias', f'(nheads,) = {(nheads, )}', dt_bias)
    if (initial_states is not None
            and initial_states.shape != (batch, nheads, headdim, dstate)):
        raise _shape_error(
            'initial_states', '(batch, nheads, headdim, dstate) = '
            f'{(batch, nheads, headdim, dstate)}', initial_states)
    check_chunk_size(chunk_size, 'ssd')
    check_finite(dt, 'ssd: `dt`')


# whether check_finite runs at all: off while a training run's NonFiniteStopHook
# watches the values (it names the iteration, the layer and the cause)
_FINITE_CHECKS = [True]


def set_finite_checks(enabled: bool) -> bool:
    """Turn :func:`check_finite` on or off in this process; returns the previous
    setting.

    ``mmdinomamba.engine.NonFiniteStopHook`` turns the checks off while training
    runs, so that a NaN is reported by the hook (iteration, layer, likely cause)
    on the CPU as on CUDA, and on again when training ends.
    """
    previous = _FINITE_CHECKS[0]
    _FINITE_CHECKS[0] = bool(enabled)
    return previous


def _check_finite(t: Tensor) -> bool:
    """Whether to run the (device-synchronising) finiteness check on ``t``."""
    if not _FINITE_CHECKS[0]:
        return False
    return t.device.type != 'cuda' or os.environ.get('MMDINOMAMBA_CHECK_FINITE') == '1'


def check_finite(t: Tensor, what: str) -> None:
    """Raise a ValueError ``'<what> contains NaN or Inf values'`` if ``t`` has any.

    Runs always for CPU tensors and, because it reads a value back from the
    device (a host synchronisation), for CUDA tensors only with
    ``MMDINOMAMBA_CHECK_FINITE=1``; never while ``torch.compile`` traces, nor in a
    dry run (:func:`~mmdinomamba.ops.spec.skip_kernels`: its numbers are garbage),
    nor while :func:`set_finite_checks` has turned it off (a training run whose
    ``NonFiniteStopHook`` reports non-finite values).

    Args:
        t (Tensor): any shape.
        what (str): names the tensor in the message, e.g. ``'SSDMixer: input'``.
    """
    if torch.compiler.is_compiling() or dry_run() is not None or not _check_finite(t):
        return
    finite = torch.isfinite(t)
    if not finite.all():
        bad = finite.numel() - int(finite.sum())
        raise ValueError(f'{what} contains NaN or Inf values ({bad} of '
                         f'{finite.numel()})')


_QUADRATIC_WARNED = [False]


def _warn_quadratic_memory(x: Tensor) -> None:
    """Warn once per process when a 'quadratic' call's mixing matrices would be large."""
    batch, seqlen, nheads, _ = x.shape
    itemsize = 8 if x.dtype == torch.float64 else 4
    need = batch * nheads * seqlen * seqlen * itemsize
    if need <= QUADRATIC_WARN_BYTES or _QUADRATIC_WARNED[0]:
        return
    _QUADRATIC_WARNED[0] = True
    warnings.warn(
        f"ssd: backend 'quadratic' materialises a seqlen x seqlen mixing matrix per "
        f'head: {need / 2**30:.2f} GiB for M alone here (batch {batch} x {nheads} heads '
        f'x {seqlen}^2 tokens x {itemsize} bytes), and building it holds several such '
        "tensors at once; backend 'chunked' computes the same in O(seqlen) memory",
        stacklevel=3)


def check_quadratic_length(seqlen: int) -> None:
    """Refuse backend 'quadratic' for sequences longer than
    :data:`QUADRATIC_MAX_SEQLEN` tokens (1024), where a batch would take minutes
    on a CPU (the measurement is at the constant).

    Raises:
        ValueError: naming the length, the limit and the backend to use instead.
    """
    if seqlen > QUADRATIC_MAX_SEQLEN:
        raise ValueError(
            f"ssd: backend 'quadratic' builds a {seqlen} x {seqlen} mixing matrix per "
            f'head, and refuses sequences longer than {QUADRATIC_MAX_SEQLEN} tokens '
            f'(its time grows with the square of the length: one call of 8 heads '
            f'takes about 13 s at 4096 tokens on a CPU thread, against 0.3 s for '
            "'chunked'): use ssd_backend='chunked' (the same result in time linear in "
            "the length) or 'auto', e.g. --cfg-options "
            "model.backbone.mixer_cfg.ssd_backend=auto")


# --------------------------------------------------------------------------- #
# Dispatchers
# --------------------------------------------------------------------------- #
def ssd_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
             chunk_size: Union[int, str] = CHUNK_SIZE, D: Optional[Tensor] = None,
             z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
             dt_softplus: bool = False, initial_states: Optional[Tensor] = None,
             return_final_states: bool = False, backend: str = 'auto') -> SSDOutput:
    """Mamba-2 SSD scan with mamba-ssm's ``mamba_chunk_scan_combined`` layout.

    Checks the inputs (:func:`check_ssd_inputs`), then runs the backend that
    :func:`resolve_backend` picks: :func:`~mmdinomamba.ops.ssd.ssd_chunked`,
    :func:`~mmdinomamba.ops.ssd.ssd_quadratic` or :func:`~mmdinomamba.ops.ssd.ssd_ref`
    (PyTorch; 'quadratic' up to :data:`QUADRATIC_MAX_SEQLEN` tokens:
    :func:`check_quadratic_length`), :func:`mmdinomamba.ops.triton.ssd_triton`
    (CUDA only, no ``initial_states`` / ``return_final_states``; float16, bfloat16
    and float32:
    ``'auto'`` scans float64 with ``'chunked'``; its chunk is its own tile size, so
    ``chunk_size`` only matters to the PyTorch backends, where it changes rounding,
    not the result; an explicit one is noted once as unused:
    :func:`~mmdinomamba.ops.spec.note_chunk_size_unused`) or mamba-ssm's.

    Args:
        x (Tensor): (batch, seqlen, nheads, headdim).
        dt (Tensor): (batch, seqlen, nheads).
        A (Tensor): (nheads,).
        B (Tensor): (batch, seqlen, ngroups, dstate).
        C (Tensor): (batch, seqlen, ngroups, dstate).
        chunk_size (int | str): tokens per chunk of the PyTorch backends, or
            'auto' (:func:`~mmdinomamba.ops.spec.auto_chunk_size`). Defaults to
            :data:`~mmdinomamba.ops.spec.CHUNK_SIZE` ('auto').
        D (Tensor, optional): (nheads,) or (nheads, headdim).
        z (Tensor, optional): (batch, seqlen, nheads, headdim); output * silu(z).
        dt_bias (Tensor, optional): (nheads,).
        dt_softplus (bool): ``dt = softplus(dt + dt_bias)``. Defaults to False.
        initial_states (Tensor, optional): (batch, nheads, headdim, dstate).
        return_final_states (bool): also return the final state.
        backend (str): one of :data:`BACKENDS`. Defaults to ``'auto'``.

    Returns:
        Tensor: (batch, seqlen, nheads, headdim) in x's dtype; with
        ``return_final_states`` also (batch, nheads, headdim, dstate).
    """
    check_ssd_inputs(x, dt, A, B, C, D, z, dt_bias, initial_states, chunk_size)
    needs_states = initial_states is not None or return_final_states
    chosen = resolve_backend(backend, x.device, needs_states, x.dtype)
    if chosen == 'triton':
        note_chunk_size_unused(chunk_size, "ssd_scan (backend 'triton')")
        from .triton import ssd_triton
        return ssd_triton(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                          dt_softplus=dt_softplus)
    kwargs = dict(chunk_size=resolve_chunk_size(chunk_size, x.shape[1]), D=D, z=z, dt_bias=dt_bias,
                  dt_softplus=dt_softplus, initial_states=initial_states,
                  return_final_states=return_final_states)
    if chosen == 'mamba_ssm':
        return _mamba_ssm_scan()(x, dt, A, B, C, **kwargs)
    if chosen == 'quadratic':
        check_quadratic_length(x.shape[1])
        _warn_quadratic_memory(x)
    fn = {'chunked': ssd_chunked, 'quadratic': ssd_quadratic, 'ref': ssd_ref}[chosen]
    return fn(x, dt, A, B, C, **kwargs)


def add_rms_norm(h: Tensor, residual: Optional[Tensor], weight: Tensor,
                 eps: float = 1e-5, scale: Optional[Tensor] = None
                 ) -> Tuple[Tensor, Tensor]:
    """The pre-norm step of a block, ``residual = scale * h + residual`` then
    RMSNorm: the fused kernel where :func:`use_triton` says so, else
    :func:`~mmdinomamba.ops.norm.add_rms_norm_ref` (same arguments and function).

    Returns:
        tuple: the new stream (..., dim) (float32, float64 for float64 inputs)
        and its RMSNorm (..., dim), in the dtype the next matmul computes in (the
        PyTorch path returns the weight's dtype and leaves the cast to autocast:
        same values).
    """
    if scale is not None and (h.dim() < 2 or scale.shape != h.shape[:1]):
        raise ValueError(f'add_rms_norm: scale must have shape ({h.shape[0]},) for h of '
                         f'shape {tuple(h.shape)}, got {tuple(scale.shape)}')
    if use_triton(h):
        from .triton import add_rms_norm_triton
        return add_rms_norm_triton(h, residual, weight, eps, compute_dtype(weight), scale)
    return add_rms_norm_ref(h, residual, weight, eps, scale)


def add_layer_norm(x: Tensor, h: Optional[Tensor], weight: Optional[Tensor],
                   bias: Optional[Tensor], eps: float = 1e-5) -> Tuple[Tensor, Tensor]:
    """``residual = x + h`` (x when h is None), then LayerNorm over the last axis:
    the fused kernel where :func:`use_triton` takes x (and h, weight and bias have
    Triton dtypes), else :func:`~mmdinomamba.ops.norm.add_layer_norm_ref` (same
    arguments and function).

    Returns:
        tuple: the residual (..., dim) and its LayerNorm (..., dim) in
        :func:`~mmdinomamba.ops.norm.layer_norm_out_dtype`: autocast's dtype where
        autocast is on, else the residual's.
    """
    if h is not None and h.shape != x.shape:
        raise ValueError(f'add_layer_norm: h must have the shape of x {tuple(x.shape)}, '
                         f'got {tuple(h.shape)}')
    res_dtype = x.dtype if h is None or h.dtype == x.dtype else \
        torch.promote_types(x.dtype, h.dtype)
    out_dtype = layer_norm_out_dtype(res_dtype, x.device)
    if (use_triton(x) and (h is None or h.dtype in TRITON_DTYPES)
            and (weight is None or weight.dtype in TRITON_DTYPES)
            and (bias is None or bias.dtype in TRITON_DTYPES)):
        from .triton import add_layer_norm_triton
        return add_layer_norm_triton(x, h, weight, bias, eps, out_dtype)
    return add_layer_norm_ref(x, h, weight, bias, eps, out_dtype)
