"""The SSD scan as a differentiable op, with the PyTorch scans' signature
(:func:`mmdinomamba.ops.ssd.ssd_chunked`).

Forward kernel in ``ssd_fwd.py``, backward in ``ssd_bwd.py``, what they share in
``ssd_common.py``; this module wires them into one ``torch.autograd.Function`` for
one direction (the bidirectional mixer calls the kernels directly, both
directions per launch: ``mixer.py``).
"""
from typing import Optional

import torch

from ..spec import CHUNK_SIZE
from .ssd_bwd import scan_backward, sum_heads
from .ssd_common import ScanArgs, default_backward_chunk, default_chunk
from .ssd_fwd import scan_forward

Tensor = torch.Tensor


class _SSDScan(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, dt_bias, dt_softplus):
        batch, seqlen, nheads, headdim = x.shape
        ngroups = B.shape[2]
        x5 = x.contiguous().view(batch, seqlen, 1, nheads, headdim)
        B5 = B.to(x.dtype).contiguous().view(batch, seqlen, 1, ngroups, -1)
        C5 = C.to(x.dtype).contiguous().view(batch, seqlen, 1, ngroups, -1)
        A32 = A.float().contiguous()
        bias32 = (dt_bias.float().contiguous() if dt_bias is not None else
                  torch.zeros(nheads, device=x.device))
        # (nheads, headdim) or one per head, (nheads,): the kernels read either
        D32 = D.float().contiguous() if D is not None else None
        args = ScanArgs(x5, B5, C5, dt, bias32, A32, D32, dt_softplus,
                        default_chunk(seqlen))
        y = torch.empty_like(x5)
        scan_forward(args, y)
        ctx.save_for_backward(x5, B5, C5, dt, bias32, A32, D32)
        ctx.meta = (dt_softplus, D is not None and D.dim() == 1,
                    B.dtype, dt_bias is not None, A.dtype, D.dtype if D is not None
                    else None, dt.dtype)
        return y.view(batch, seqlen, nheads, headdim)

    @staticmethod
    def backward(ctx, dy):
        x5, B5, C5, dt, bias32, A32, D32 = ctx.saved_tensors
        (dt_softplus, D_per_head, B_dtype, has_bias, A_dtype, D_dtype,
         dt_dtype) = ctx.meta
        args = ScanArgs(x5, B5, C5, dt, bias32, A32, D32, dt_softplus,
                        default_backward_chunk(x5.shape[1]))
        dy5 = dy.contiguous().view(x5.shape)
        dx = torch.empty_like(x5)
        dB, dC, ddt, dA, dbias, dD = scan_backward(args, dy5, dx, dD_per_slot=D_per_head)
        ngroups = B5.shape[3]
        dB = sum_heads(dB, 1, ngroups)[:, :, 0].to(B_dtype)
        dC = sum_heads(dC, 1, ngroups)[:, :, 0].to(B_dtype)
        dD_out = dD.to(D_dtype) if dD is not None else None
        return (dx.view(dy.shape), ddt.to(dt_dtype), dA.to(A_dtype), dB, dC,
                dD_out, dbias if has_bias else None, None)


def ssd_triton(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
               chunk_size=CHUNK_SIZE, D: Optional[Tensor] = None,
               z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
               dt_softplus: bool = False, initial_states: Optional[Tensor] = None,
               return_final_states: bool = False) -> Tensor:
    """Causal SSD scan with the Triton kernels (autograd supported).

    The signature of :func:`mmdinomamba.ops.ssd_ref` and the other backends.

    Args:
        x (Tensor): (batch, seqlen, nheads, headdim), float16/bfloat16/float32, CUDA.
        dt (Tensor): (batch, seqlen, nheads).
        A (Tensor): (nheads,).
        B, C (Tensor): (batch, seqlen, ngroups, dstate).
        chunk_size (int): accepted for the common signature; the kernels scan in
            tiles of their own (:func:`default_chunk`, :func:`default_backward_chunk`),
            and the result does not depend on the chunking.
        D (Tensor, optional): (nheads,) or (nheads, headdim).
        z (Tensor, optional): (batch, seqlen, nheads, headdim); output * silu(z).
        dt_bias (Tensor, optional): (nheads,).
        dt_softplus (bool): ``dt = softplus(dt + dt_bias)``.
        initial_states, return_final_states: not supported by the kernels (a
            ValueError); use the 'chunked' or 'ref' backend.

    Returns:
        Tensor: (batch, seqlen, nheads, headdim) in x's dtype.
    """
    if initial_states is not None or return_final_states:
        raise ValueError('ssd_triton: `initial_states` and `return_final_states` need '
                         'the chunked or ref backend')
    y = _SSDScan.apply(x, dt, A, B, C, D, dt_bias, dt_softplus)
    if z is not None:
        y = (y.float() * torch.nn.functional.silu(z.float())).to(x.dtype)
    return y
