"""Linear attention with a softmax feature map, in O(seqlen) and as a matrix.

With ``phi`` = softmax over the head dimension (rows of Q and K become
probability vectors), the mixing matrix is::

    M = diag(1 / (phi(Q) phi(K)^T 1)) phi(Q) phi(K)^T          (rows sum to 1)

and ``y = M v``. :func:`linear_attention` computes ``y`` without forming M
(associativity: ``phi(Q) (phi(K)^T v)``); :func:`linear_attention_matrix` forms M
(its slow twin, and the rank-analysis view: rank(M) <= headdim).
"""
import torch

from .spec import at_least_float32

Tensor = torch.Tensor


def feature_map(t: Tensor) -> Tensor:
    """``phi``: softmax over the last (head) dimension, in fp32 (fp64 for fp64 input)."""
    return at_least_float32(t).softmax(dim=-1)


def linear_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal linear attention, O(seqlen * headdim^2).

    Args:
        q, k (Tensor): (batch, nheads, seqlen, headdim).
        v (Tensor): (batch, nheads, seqlen, headdim_v).

    Returns:
        Tensor: (batch, nheads, seqlen, headdim_v) in v's dtype.
    """
    fq, fk = feature_map(q), feature_map(k)
    kv = torch.einsum('bhsd,bhse->bhde', fk, at_least_float32(v).to(fk.dtype))
    num = torch.einsum('bhld,bhde->bhle', fq, kv)
    den = torch.einsum('bhld,bhd->bhl', fq, fk.sum(dim=2))
    return (num / den[..., None]).to(v.dtype)


def linear_attention_matrix(q: Tensor, k: Tensor) -> Tensor:
    """The mixing matrix M, (batch, nheads, seqlen, seqlen), rows summing to 1."""
    scores = torch.einsum('bhld,bhsd->bhls', feature_map(q), feature_map(k))
    return scores / scores.sum(dim=-1, keepdim=True)
