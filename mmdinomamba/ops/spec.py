"""What every implementation of the ops takes: sizes, parameters, dtypes, one switch.

A leaf (it imports torch alone): the PyTorch references of :mod:`mmdinomamba.ops`,
the dispatchers of :mod:`mmdinomamba.ops.backend` and the Triton kernels of
:mod:`mmdinomamba.ops.triton` all read these definitions, and none of them is
imported back here.

* the mixer's and a block's contracts: :class:`MixerSpec`, :class:`MixerParams`,
  :class:`BlockSpec`, :class:`BlockParams`, the packed projection's layout
  (:func:`split_projection`) and the block numbers a stack returns
  (:func:`block_indices`);
* dtypes: the kernels' (:data:`TRITON_DTYPES`), the one sums and norms run in
  (:func:`float32_or_wider`), the one a matrix product after a norm runs in
  (:func:`compute_dtype`);
* the SSD scan's ``chunk_size``: its one default (:data:`CHUNK_SIZE`), its one
  check (:func:`check_chunk_size`), what 'auto' means (:func:`auto_chunk_size`,
  :func:`resolve_chunk_size`) and the note of a fused path that tiles by itself
  (:func:`note_chunk_size_unused`);
* :func:`skip_kernels`, a dry run of the fused path with its kernels skipped, for
  measuring the host's work (read by :func:`dry_run` alone).
"""
import contextlib
import warnings
from typing import Dict, Iterator, NamedTuple, Optional, Sequence, Tuple, Union

import torch

Tensor = torch.Tensor

# --------------------------------------------------------------------------- #
# Dtypes
# --------------------------------------------------------------------------- #
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def float32_or_wider(dtype: torch.dtype) -> torch.dtype:
    """The dtype that sums, scans and norms run in: float64 for float64, float32 for
    the rest (float16, bfloat16, float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def at_least_float32(t: Tensor) -> Tensor:
    """``t`` in :func:`float32_or_wider` of its dtype; ``t`` itself (no operator)
    when it already has that dtype."""
    dtype = float32_or_wider(t.dtype)
    return t if t.dtype == dtype else t.to(dtype)


def compute_dtype(weight: Tensor) -> torch.dtype:
    """The dtype a matmul after a norm computes in: autocast's, else the weight's."""
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


# --------------------------------------------------------------------------- #
# The SSD scan's chunk
# --------------------------------------------------------------------------- #
CHUNK_SIZE = 'auto'  # every scan's and mixer's default: auto_chunk_size(seqlen)


def auto_chunk_size(seqlen: int) -> int:
    """The PyTorch scan's chunk for ``chunk_size='auto'``: the whole sequence up to
    128 tokens, else 64. The intra-chunk step costs seqlen x chunk and the chunk
    count adds steps, so both ends lose (CPU, 256-wide DinoVim, 4 layers, forward +
    backward, batch 2, one thread: 258 tokens 489 ms with chunk 64, 1105 ms with
    256; 66 tokens 119 ms in one chunk, 212 ms with chunk 64).

    ``seqlen`` may be a 0-d tensor: a tensor's size under ``torch.jit.trace``
    (mmengine's FLOP counter traces the model); the chunk is a plain int either way.
    """
    seqlen = int(seqlen)
    return seqlen if seqlen <= 128 else 64


def check_chunk_size(chunk_size: Union[int, str], who: str = 'ssd') -> None:
    """Raise a ValueError unless ``chunk_size`` is a positive int or 'auto'."""
    if chunk_size != 'auto' and not (isinstance(chunk_size, int)
                                     and not isinstance(chunk_size, bool)
                                     and chunk_size > 0):
        raise ValueError(f"{who}: chunk_size must be a positive int or 'auto', got "
                         f'{chunk_size!r}')


def resolve_chunk_size(chunk_size: Union[int, str], seqlen: int) -> int:
    """The tokens per chunk a PyTorch scan of ``seqlen`` tokens uses."""
    return auto_chunk_size(seqlen) if chunk_size == 'auto' else chunk_size


_CHUNK_NOTES = set()


def note_chunk_size_unused(chunk_size: Union[int, str], path: str) -> None:
    """Say once per process and ``path`` (a ``UserWarning``) that a fused path got
    a ``chunk_size`` other than :data:`CHUNK_SIZE`, which it cannot honour: the
    Triton kernels scan in tiles of their own (the result does not depend on the
    chunking; rounding may differ)."""
    if torch.compiler.is_compiling() or chunk_size == CHUNK_SIZE \
            or path in _CHUNK_NOTES:
        return
    _CHUNK_NOTES.add(path)
    warnings.warn(f'{path}: chunk_size={chunk_size!r} is not used: the fused Triton '
                  'kernels scan in tiles of their own (the result does not depend on '
                  "the chunking). It applies to the PyTorch backends ('chunked'); "
                  f"leave it at {CHUNK_SIZE!r} to silence this note.", stacklevel=3)


# --------------------------------------------------------------------------- #
# The SSD mixer after its input projection
# --------------------------------------------------------------------------- #
class MixerSpec(NamedTuple):
    """Sizes and settings of a mixer (see :class:`mmdinomamba.models.mixers.SSDMixer`).

    ``chunk_size`` (tokens, or 'auto': :func:`auto_chunk_size`) and
    ``ssd_backend`` choose how the PyTorch path scans; the fused path is the
    'triton' backend with tiles of its own (:func:`note_chunk_size_unused`).
    """
    d_inner: int
    ngroups: int
    d_state: int
    headdim: int
    ndir: int
    eps: float
    d_conv: int = 4
    chunk_size: Union[int, str] = CHUNK_SIZE
    ssd_backend: str = 'auto'

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.ngroups * self.d_state


class MixerParams(NamedTuple):
    """The mixer's parameters after ``in_proj``: per direction (forward first) a
    tuple entry, as the module holds them (no copies).

    Attributes:
        conv_w: each (conv_dim, 1, d_conv), ``nn.Conv1d`` layout.
        conv_b: each (conv_dim,), or None (no conv bias).
        dt_bias, A_log, D: each (nheads,).
        norm_w: each (d_inner,), the gated norm's scale.
        out_w (Tensor): (dim, d_inner), ``out_proj`` weight.
        out_b (Tensor, optional): (dim,).
    """
    conv_w: Tuple[Tensor, ...]
    conv_b: Optional[Tuple[Tensor, ...]]
    dt_bias: Tuple[Tensor, ...]
    A_log: Tuple[Tensor, ...]
    D: Tuple[Tensor, ...]
    norm_w: Tuple[Tensor, ...]
    out_w: Tensor
    out_b: Optional[Tensor]


def split_projection(zxbcdt: Tensor, spec: MixerSpec) -> Tuple[Tensor, Tensor, Tensor]:
    """The gate z (..., d_inner), the conv input xBC (..., conv_dim) and the raw
    steps dt (..., nheads) of the packed projection ``[z, x, B, C, dt]`` (views)."""
    # split_with_sizes: Tensor.split wraps it in Python
    return zxbcdt.split_with_sizes((spec.d_inner, spec.conv_dim, spec.nheads), dim=-1)


# --------------------------------------------------------------------------- #
# A stack of pre-norm SSD blocks
# --------------------------------------------------------------------------- #
class BlockParams(NamedTuple):
    """One block's parameters, as the modules hold them (no copies).

    Attributes:
        norm_w (Tensor): (dim,), the pre-norm's scale.
        in_w (Tensor): (width, dim), ``in_proj`` weight.
        in_b (Tensor, optional): (width,).
        core (MixerParams): the mixer's parameters after ``in_proj``.
    """
    norm_w: Tensor
    in_w: Tensor
    in_b: Optional[Tensor]
    core: MixerParams


class BlockSpec(NamedTuple):
    """One block's sizes: the pre-norm's eps and the mixer's :class:`MixerSpec`."""
    norm_eps: float
    mixer: MixerSpec


def block_indices(indices: Optional[Sequence[int]], nblocks: int) -> Tuple[int, ...]:
    """``indices`` checked, sorted and without repeats; None is the last block."""
    if indices is None:
        return (nblocks - 1, )
    out = tuple(sorted(set(indices)))
    if not out or out[0] < 0 or out[-1] >= nblocks:
        raise ValueError(f'blocks: indices must be block numbers in [0, {nblocks}), '
                         f'got {list(indices)}')
    return out


# --------------------------------------------------------------------------- #
# Dry run: the fused path with its kernels skipped
# --------------------------------------------------------------------------- #
class DryRun:
    """The state of one :func:`skip_kernels` block.

    Attributes:
        launches (int): kernel launches skipped so far.
        launchers (dict): the launchers used inside the block, by kernel
            (:mod:`mmdinomamba.ops.triton.launch`); they go with it.
    """

    def __init__(self):
        self.launches = 0
        self.launchers: Dict[int, object] = {}


_DRY_RUN: Optional[DryRun] = None


def dry_run() -> Optional[DryRun]:
    """The active :func:`skip_kernels` block's state, or None: the one place the
    switch is read."""
    return _DRY_RUN


@contextlib.contextmanager
def skip_kernels() -> Iterator[DryRun]:
    """Run the fused path's host side on any tensors, CPU ones included, with its
    kernels skipped: a measurement of the host's work per step.

    Inside, the dispatchers of :mod:`mmdinomamba.ops.backend` take the fused path
    wherever Triton imports, on any device (a machine without a GPU too), and every
    Triton launch does the launcher's own work (its arguments and cache key, as on
    CUDA) up to the driver's call, which is skipped and counted. The torch operators
    around the kernels (allocations, views, matrix products, reductions) run for
    real. No kernel writes its outputs, so the numbers computed are garbage and
    the finiteness checks are off (:func:`mmdinomamba.ops.backend.check_finite`).

    Yields:
        DryRun: ``launches`` counts the skipped launches.
    """
    global _DRY_RUN
    if _DRY_RUN is not None:
        raise RuntimeError('skip_kernels: already inside a skip_kernels block')
    _DRY_RUN = DryRun()
    try:
        yield _DRY_RUN
    finally:
        _DRY_RUN = None
