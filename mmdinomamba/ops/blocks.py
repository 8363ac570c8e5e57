"""A stack of pre-norm SSD blocks, one call for all of them: two implementations.

Block ``i`` of DinoVim, with ``s_i`` its per-sample stochastic-depth factor (0 or
``1 / keep``; 1 without drop path) and the residual stream in float32::

    residual_i = s_i h_{i-1} + residual_{i-1}      (block 0: residual_0 = tokens)
    u_i        = rmsnorm(residual_i) * w_i
    h_i        = mixer_core(in_proj(u_i))          (:mod:`mmdinomamba.ops.mixer`)

:func:`blocks_loop` writes this as the loop it is, each step through its own
dispatcher (:func:`~mmdinomamba.ops.backend.add_rms_norm`,
:func:`~mmdinomamba.ops.mixer.mixer_core`):
the PyTorch ops on a CPU (the twin every fast path is tested against), and what
``torch.compile`` traces on CUDA. :func:`mmdinomamba.ops.triton.blocks_triton` runs
the fused kernels of each block and makes the whole stack one autograd node (the
least host work per eager step). Same arguments, same function; :func:`run_blocks`
picks one, by the rule of :mod:`mmdinomamba.ops.backend`.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .backend import add_rms_norm, uses_fused_blocks
from .mixer import mixer_core
from .spec import BlockParams, BlockSpec, block_indices, note_chunk_size_unused

Tensor = torch.Tensor


def blocks_loop(tokens: Tensor, params: Sequence[BlockParams],
                specs: Sequence[BlockSpec], scales: Optional[Tensor] = None,
                indices: Optional[Sequence[int]] = None) -> List[Tuple[Tensor, Tensor]]:
    """The blocks one after the other, each step dispatched on its own (on a CPU:
    the PyTorch ops, the twin of the fused stack).

    Args:
        tokens (Tensor): (batch, seqlen, dim), the first block's input.
        params (Sequence[BlockParams]): per block, its parameters.
        specs (Sequence[BlockSpec]): per block, its sizes.
        scales (Tensor, optional): (nblocks, batch) float32 stochastic-depth factors;
            row ``i`` multiplies block ``i - 1``'s output as block ``i`` adds it (row
            0 is not read). None: no drop path.
        indices (Sequence[int], optional): the blocks whose outputs to return (the
            blocks after the last of them do not run). None: the last block.

    Returns:
        list: per index, ascending, the block's mixer output ``h`` (batch, seqlen,
        dim) and the residual stream it was computed from (float32, float64 for
        float64 tokens).
    """
    wanted = block_indices(indices, len(params))
    outs = []
    h, residual = tokens, None
    for i in range(wanted[-1] + 1):
        p, spec = params[i], specs[i]
        scale = scales[i] if scales is not None and residual is not None else None
        residual, normed = add_rms_norm(h, residual, p.norm_w, spec.norm_eps, scale)
        h = mixer_core(F.linear(normed, p.in_w, p.in_b), p.core, spec.mixer)
        if i in wanted:
            outs.append((h, residual))
    return outs


def run_blocks(tokens: Tensor, params: Sequence[BlockParams],
               specs: Sequence[BlockSpec], scales: Optional[Tensor] = None,
               indices: Optional[Sequence[int]] = None) -> List[Tuple[Tensor, Tensor]]:
    """The blocks: fused where :func:`mmdinomamba.ops.backend.uses_fused_blocks`
    says so, else :func:`blocks_loop`. Same arguments and result as
    :func:`blocks_loop`."""
    if uses_fused_blocks(tokens, specs):
        for spec in specs:
            note_chunk_size_unused(spec.mixer.chunk_size, 'SSD blocks (fused Triton stack)')
        from .triton import blocks_triton
        return blocks_triton(tokens, params, specs, scales, indices)
    return blocks_loop(tokens, params, specs, scales, indices)
