"""A stack of pre-norm SSD blocks as one autograd function of fused kernels.

:func:`blocks_triton` computes :func:`mmdinomamba.ops.blocks.blocks_loop` (same
arguments, same function; the equations are in :mod:`mmdinomamba.ops.blocks`) with
the kernels each block runs on CUDA (the add + norm of :mod:`.norm`, ``in_proj``'s
matrix product, the mixer core of :mod:`.mixer`), in the same order as
:class:`~mmdinomamba.models.backbones.dino_vim.MambaBlock` calls them one block at a
time, so the two give the same numbers bit for bit. What differs is the host's
work: called one block at a time, each block makes three autograd nodes (the add +
norm, ``in_proj`` with its cast and transposes, the mixer core), each with its own
context, saved-tensor bookkeeping and output checks, 72 for DinoVim's 24 blocks;
here the stack is one node, whose backward runs the blocks' backward in a plain
loop, taking in the gradients of the blocks whose outputs it returned as it
reaches them. An eager step's host time follows the operators and nodes it issues
(``benchmarks/README.md``), so this is what DinoVim runs eagerly on CUDA.

Memory: the backward keeps per block what the three nodes keep (the add + norm's
normalised rows and rstd, ``in_proj``'s input and weight in the compute dtype, the
mixer core's projection, scan output and norm rstd), and frees each block's once its
backward has run, as the engine frees the nodes'. So a second backward through the
same forward is refused (``retain_graph`` does not apply).
"""
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..spec import BlockParams, BlockSpec, block_indices, compute_dtype
from .launch import cast
from .mixer import _core_backward, _core_forward, _flat_params, _unstack
from .norm import _add_norm_backward, _add_norm_forward

Tensor = torch.Tensor


class _Layout(NamedTuple):
    """Where one block's tensors are in the flat list: ``norm_w`` at ``start``,
    then ``in_w``, ``in_b`` (if any), ``out_w``, ``out_b`` (if any), and the mixer
    core's list (:func:`~.mixer._flat_params`) from ``core`` to ``end``."""
    start: int
    in_b: bool
    out_w: int
    out_b: bool
    core: int
    end: int
    conv_b: bool


def _flatten(params: Sequence[BlockParams]) -> Tuple[List[Tensor], Tuple[_Layout, ...]]:
    """All tensors in one list (what the autograd function takes), and where each
    block's are."""
    flat, layout = [], []
    for p in params:
        core = _flat_params(p.core)
        has_in_b, has_out_b = p.in_b is not None, p.core.out_b is not None
        start = len(flat)
        out_w = start + 2 + has_in_b
        layout.append(_Layout(start, has_in_b, out_w, has_out_b, out_w + 1 + has_out_b,
                              out_w + 1 + has_out_b + len(core),
                              p.core.conv_b is not None))
        flat += [p.norm_w, p.in_w, *(p.in_b, ) * has_in_b, p.core.out_w,
                 *(p.core.out_b, ) * has_out_b, *core]
    return flat, tuple(layout)


def _forward(tokens: Tensor, scales: Optional[Tensor], flat: Sequence[Tensor],
             layout: Sequence[_Layout], specs: Sequence[BlockSpec],
             indices: Tuple[int, ...], saved: Optional[list]) -> List[Tensor]:
    """Run the blocks up to the last of ``indices``; append to ``saved`` (if given)
    what each block's backward reads. Returns ``h`` and ``residual``, each (batch,
    seqlen, dim), after each block of ``indices``, in one flat list."""
    batch, seqlen, dim = tokens.shape
    cdt = compute_dtype(flat[1])
    half = cdt in (torch.float16, torch.bfloat16)
    outs = []
    h, residual = tokens, None
    for i in range(indices[-1] + 1):
        at, spec = layout[i], specs[i]
        norm_w, in_w = flat[at.start], flat[at.start + 1]
        in_b = flat[at.start + 2] if at.in_b else None
        out_w, out_b = flat[at.out_w], flat[at.out_w + 1] if at.out_b else None
        scale = scales[i] if scales is not None and i else None
        residual, normed, rstd, n_half, _ = _add_norm_forward(
            h, residual, norm_w, spec.norm_eps, cdt, scale, half and saved is not None)
        w_in = cast(in_w, cdt)
        zxbcdt = F.linear(normed, w_in, cast(in_b, cdt) if in_b is not None else None)
        res, y2, rstd2, p, w_c = _core_forward(
            zxbcdt.view(batch, seqlen, -1), out_w, out_b, flat[at.core:at.end],
            spec.mixer, at.conv_b)
        if saved is not None:
            saved.append((n_half if half else residual, rstd, scale, normed, w_in,
                          zxbcdt, y2, rstd2, p, w_c, h.dtype))
        h = res
        if i in indices:
            outs += [h, residual.view(batch, seqlen, dim)]
    return outs


class _Blocks(torch.autograd.Function):

    @staticmethod
    def forward(ctx, specs, layout, indices, tokens, scales, *flat):
        ctx.saved = []
        outs = _forward(tokens, scales, flat, layout, specs, indices, ctx.saved)
        ctx.specs, ctx.layout, ctx.indices, ctx.flat = specs, layout, indices, flat
        ctx.tokens_shape = tokens.shape
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *douts):
        saved = ctx.saved
        if saved is None:
            raise RuntimeError('blocks_triton: the fused blocks were already '
                               'backpropagated through; run the forward again')
        ctx.saved = None
        flat, layout, specs = ctx.flat, ctx.layout, ctx.specs
        batch, seqlen, dim = ctx.tokens_shape
        # the gradients of each returned block's h and residual (None: unused)
        incoming = dict(zip(ctx.indices, zip(douts[0::2], douts[1::2])))
        grads: List[Optional[Tensor]] = [None] * len(flat)
        dh = dres = None  # of the current block's h and residual
        for i in range(len(saved) - 1, -1, -1):
            at, spec = layout[i], specs[i]
            (n_saved, rstd, scale, normed, w_in, zxbcdt, y2, rstd2, p, w_c,
             h_dtype) = saved.pop()  # frees the block's tensors after its backward
            dh_out, dres_out = incoming.get(i, (None, None))
            dh, dres = _add(dh, dh_out, dim), _add(dres, dres_out, dim)
            if dh is None:  # only the residual is used
                dh = torch.zeros(batch * seqlen, dim, device=zxbcdt.device,
                                 dtype=w_in.dtype)
            norm_w, in_w = flat[at.start], flat[at.start + 1]
            out_w, core = flat[at.out_w], flat[at.core:at.end]
            dzx, grads[at.out_w], dout_b, stacked = _core_backward(
                dh, zxbcdt.view(batch, seqlen, -1), y2, rstd2, w_c, out_w.dtype,
                at.out_b, core, p, spec.mixer)
            if at.out_b:
                grads[at.out_w + 1] = dout_b
            grads[at.core:at.end] = _unstack(stacked, core)
            # in_proj, then the add + norm
            dzx2 = dzx.view(-1, dzx.shape[-1])
            grads[at.start + 1] = cast(torch.mm(dzx2.t(), normed), in_w.dtype)
            if at.in_b:
                in_b = flat[at.start + 2]
                grads[at.start + 2] = dzx2.sum(0, dtype=torch.float32).to(in_b.dtype)
            dres, dh, dnorm_w = _add_norm_backward(
                torch.mm(dzx2, w_in), dres, n_saved, norm_w, rstd, scale, h_dtype,
                seqlen, n_saved.dtype != torch.float32)
            grads[at.start] = cast(dnorm_w, norm_w.dtype)
        # block 0's stream is the tokens themselves: dh is their gradient
        return (None, None, None, dh.view(ctx.tokens_shape), None, *grads)


def _add(a: Optional[Tensor], b: Optional[Tensor], dim: int) -> Optional[Tensor]:
    """``a + b`` as (rows, dim), where either may be None (zero)."""
    if b is not None:
        b = b.reshape(-1, dim)
    if a is None:
        return b
    return a if b is None else a + b


def blocks_triton(tokens: Tensor, params: Sequence[BlockParams],
                  specs: Sequence[BlockSpec], scales: Optional[Tensor] = None,
                  indices: Optional[Sequence[int]] = None
                  ) -> List[Tuple[Tensor, Tensor]]:
    """The blocks of a DinoVim stack in fused kernels, as one autograd node.

    Args:
        tokens (Tensor): (batch, seqlen, dim), CUDA, the first block's input.
        params (Sequence[BlockParams]): per block, its parameters.
        specs (Sequence[BlockSpec]): per block, its sizes.
        scales (Tensor, optional): (nblocks, batch) float32 stochastic-depth
            factors; row ``i`` multiplies block ``i - 1``'s output as block ``i``
            adds it (row 0 is not read). None: no drop path.
        indices (Sequence[int], optional): the blocks whose outputs to return (the
            blocks after the last of them do not run). None: the last block.

    Returns:
        list: per index, ascending, the block's mixer output ``h`` (batch, seqlen,
        dim) in the compute dtype and the residual stream it was computed from,
        float32.
    """
    indices = block_indices(indices, len(params))
    flat, layout = _flatten(params[:indices[-1] + 1])
    specs = tuple(specs)
    if not torch.is_grad_enabled() or not (tokens.requires_grad or any(
            p.requires_grad for p in flat)):  # no graph to record (a frozen stack)
        outs = _forward(tokens, scales, flat, layout, specs, indices, None)
    else:
        outs = _Blocks.apply(specs, layout, indices, tokens, scales, *flat)
    return list(zip(outs[0::2], outs[1::2]))
