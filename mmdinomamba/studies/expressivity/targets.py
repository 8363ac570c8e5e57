"""Target matrices of the expressivity probe and their closed-form floors.

Each target is a seqlen x seqlen matrix T whose structure is known
(:data:`TARGETS`), built in float64:

===================  ==========================================================
name                 T
===================  ==========================================================
permutation          a random permutation matrix: ``T[i, pi(i)] = 1`` (full
                     rank, its ones far off the diagonal)
band_1d              a 1-D convolution: ``T[i, j] = k[j - i]``, kernel
                     ``k = (1, 2, 1) / 4`` (zero padding)
band_2d              a 2-D 3 x 3 convolution on the tokens' grid (h, w) in
                     raster order (:func:`grid_shape`), kernel
                     ``(1, 2, 1)^T (1, 2, 1) / 16`` (what LePE and a depthwise
                     conv express)
smooth_kernel        a Gaussian kernel of the token positions,
                     ``exp(-(i - j)^2 / (2 (0.05 L)^2))``: smooth and
                     numerically low rank, whatever L
row_stochastic       a random row-stochastic matrix: rows drawn from
                     Dirichlet(1, ..., 1)
causal_decay         ``0.9 ** (i - j)`` for ``i >= j``, 0 above the diagonal:
                     the mask of one SSD head with a constant step
trained_attention    one head's attention among the patches of a trained
                     model, on one image whose patch grid has L cells
                     (:func:`trained_attention`)
===================  ==========================================================

The floors are lower bounds on the relative error ``||M - T||_F / ||T||_F``
of any M of a given structure, in closed form:

- :func:`rank_floor`, Eckart-Young: no matrix of rank <= r comes closer to T
  than ``sqrt(sum_{k > r} s_k^2) / sqrt(sum_k s_k^2)``, s the singular values of
  T (``torch.linalg.svdvals``);
- the same for the block strictly below the diagonal, rows ``[L - L // 2, L)``
  x columns ``[0, L // 2)`` (:func:`offdiag_block`): the bound of a matrix
  whose off-diagonal blocks have rank <= r (SSD: r = N per head);
- :func:`causal_floor`: no lower-triangular M comes closer than the norm of
  T's strictly upper part;
- :func:`semiseparable_floor`: no M whose blocks ``M[k:, :k]`` (and, two-sided,
  ``M[:k, k:]``) have rank <= r at every split point k (the SSD: r = N per
  head) comes closer than the Eckart-Young tails of T's blocks beyond rank r,
  summed over disjoint blocks (below);
- :func:`row_sum_floor`: no M whose rows have one common sum (softmax and
  linear attention: rows sum to the head weight; any heads) comes closer than
  the spread of T's row sums; for a non-negative M with equal row sums (one
  head), the distance to that convex cone.

Every floor is a lower bound on the family's best error, whatever the
optimiser does: a fit in ``[floor, fit]`` brackets the family's capacity.

The semiseparable floor. Let every block ``M[k:, :k]``, k = 1 .. L - 1, have
rank <= r. Entries of disjoint blocks add in ``||M - T||_F^2``, and each block
``B`` inside a rank-<= r block has rank <= r, so by Eckart-Young::

    ||M - T||_F^2 >= sum_B tail_r(T_B)^2        tail_r(A)^2 = sum_(i > r) s_i(A)^2

for any family of disjoint blocks B, each inside some ``[k:, :k]``. Two such
families are evaluated and the larger bound kept: the single split
``[k:, :k]`` (max over k), and the dyadic partition of the strict lower
triangle (``[m, b) x [a, m)`` for every interval ``[a, b)`` of the recursive
halving of ``[0, L)``, m its midpoint), whose blocks tile it up to the
entries next to the diagonal. Two-sided (the bidirectional SSD) adds the
transposed blocks of the strict upper triangle (disjoint from the lower ones)
to each family.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

Tensor = torch.Tensor

__all__ = ['TARGETS', 'Target', 'build_target', 'causal_floor', 'check_attention_head',
           'check_target', 'dyadic_blocks', 'grid_shape', 'normalise_image',
           'offdiag_block', 'project_simplex', 'rank_floors', 'row_sum_floor',
           'semiseparable_floor', 'trained_attention', 'trained_attention_image']


def grid_shape(seqlen: int) -> Tuple[int, int]:
    """The patch grid (h, w) of ``seqlen`` tokens: h the largest divisor of
    seqlen with h <= sqrt(seqlen) (64 -> 8 x 8, 128 -> 8 x 16, 512 -> 16 x 32)."""
    h = int(np.floor(np.sqrt(seqlen)))
    while seqlen % h:
        h -= 1
    return h, seqlen // h


def _toeplitz_band(n: int, kernel: Sequence[float]) -> Tensor:
    """(n, n) with ``T[i, j] = kernel[j - i + r]`` for ``|i - j| <= r``."""
    r = len(kernel) // 2
    T = torch.zeros(n, n, dtype=torch.float64)
    for offset, value in zip(range(-r, r + 1), kernel):
        T += value * torch.ones(n - abs(offset), dtype=torch.float64).diag(offset)
    return T


def _permutation(seqlen: int, generator: torch.Generator) -> Tensor:
    perm = torch.randperm(seqlen, generator=generator)
    return torch.eye(seqlen, dtype=torch.float64)[perm]


def _band_1d(seqlen: int, generator: torch.Generator) -> Tensor:
    return _toeplitz_band(seqlen, (0.25, 0.5, 0.25))


def _band_2d(seqlen: int, generator: torch.Generator) -> Tensor:
    h, w = grid_shape(seqlen)
    # a separable 3 x 3 kernel on the raster order is the Kronecker product
    return torch.kron(_toeplitz_band(h, (0.25, 0.5, 0.25)),
                      _toeplitz_band(w, (0.25, 0.5, 0.25)))


def _smooth_kernel(seqlen: int, generator: torch.Generator) -> Tensor:
    i = torch.arange(seqlen, dtype=torch.float64)
    width = 0.05 * seqlen
    return torch.exp(-(i[:, None] - i[None, :]) ** 2 / (2 * width ** 2))


def _row_stochastic(seqlen: int, generator: torch.Generator) -> Tensor:
    # Dirichlet(1, ..., 1) rows: normalised standard exponential draws
    E = -torch.log(torch.rand(seqlen, seqlen, generator=generator,
                              dtype=torch.float64))
    return E / E.sum(dim=1, keepdim=True)


def _causal_decay(seqlen: int, generator: torch.Generator) -> Tensor:
    i = torch.arange(seqlen, dtype=torch.float64)
    lag = i[:, None] - i[None, :]
    return torch.where(lag >= 0, 0.9 ** lag.clamp(min=0), torch.zeros(()))


@dataclass(frozen=True)
class Target:
    """One row of :data:`TARGETS`.

    Attributes:
        build (callable): ``(seqlen, generator) -> T`` (seqlen, seqlen) float64;
            None for a target that is read from a model (trained_attention).
        random (bool): whether T depends on the generator.
        description (str): one line for the report.
    """
    build: Optional[Callable[[int, torch.Generator], Tensor]]
    random: bool
    description: str


TARGETS: Dict[str, Target] = {
    'permutation': Target(_permutation, True, 'random permutation'),
    'band_1d': Target(_band_1d, False, '1-D band, kernel (1, 2, 1) / 4'),
    'band_2d': Target(_band_2d, False, '2-D 3 x 3 band on the patch grid'),
    'smooth_kernel': Target(_smooth_kernel, False,
                            'Gaussian kernel of the positions, width 0.05 L'),
    'row_stochastic': Target(_row_stochastic, True, 'Dirichlet(1) rows'),
    'causal_decay': Target(_causal_decay, False, '0.9 ** (i - j), i >= j'),
    'trained_attention': Target(None, False,
                                'attention among the patches of a trained model'),
}


def build_target(name: str, seqlen: int, seed: int = 0) -> Tensor:
    """The synthetic target ``name`` at ``seqlen`` tokens.

    Args:
        name (str): a key of :data:`TARGETS` other than 'trained_attention'.
        seqlen (int): L.
        seed (int): seed of a random target's draw. Defaults to 0.

    Returns:
        Tensor: (seqlen, seqlen) float64.
    """
    if name not in TARGETS:
        raise ValueError(f'unknown target {name!r}; choose one of {sorted(TARGETS)}')
    if TARGETS[name].build is None:
        raise ValueError(f'target {name!r} is read from a model: use '
                         'trained_attention(...)')
    if not isinstance(seqlen, int) or seqlen < 2:
        raise ValueError(f'seqlen must be an int >= 2, got {seqlen!r}')
    return TARGETS[name].build(seqlen, torch.Generator().manual_seed(seed))


def check_target(T: Tensor) -> None:
    """Raise a ValueError unless T is a finite, non-zero square matrix."""
    if not isinstance(T, torch.Tensor):
        raise TypeError(f'the target must be a torch.Tensor, got {type(T).__name__}')
    if T.dim() != 2 or T.shape[0] != T.shape[1]:
        raise ValueError('the target must be a square matrix (seqlen, seqlen), got '
                         f'shape {tuple(T.shape)}')
    if T.shape[0] < 2:
        raise ValueError(f'the target must have at least 2 tokens, got {T.shape[0]}')
    if not torch.isfinite(T).all():
        raise ValueError('the target contains NaN or Inf values')
    if not T.abs().sum() > 0:
        raise ValueError('the target is all zeros: its relative error is undefined')


def offdiag_block(T: Tensor) -> Tensor:
    """The block strictly below the diagonal: rows ``[L - L // 2, L)``, columns
    ``[0, L // 2)`` of (..., L, L) -> (..., L // 2, L // 2)."""
    half = T.shape[-1] // 2
    return T[..., T.shape[-2] - half:, :half]


def rank_floors(T: Tensor, ranks: Sequence[int]) -> Dict[int, float]:
    """Eckart-Young: the least relative Frobenius error of a rank-r matrix.

    Args:
        T (Tensor): (m, n), not all zeros.
        ranks (Sequence[int]): r values (>= 0; r >= min(m, n) gives 0).

    Returns:
        dict: r -> ``sqrt(sum_{k > r} s_k^2) / ||T||_F``, s =
        ``torch.linalg.svdvals(T)`` in float64.
    """
    s2 = torch.linalg.svdvals(T.double()) ** 2
    total = s2.sum()
    # tail[r] = sum_{k >= r} s_k^2 (0-based): what a rank-r approximation misses
    tail = s2.flip(0).cumsum(0).flip(0)
    out = {}
    for r in ranks:
        if not isinstance(r, int) or r < 0:
            raise ValueError(f'ranks must be non-negative ints, got {r!r}')
        out[r] = float((tail[r] / total).sqrt()) if r < len(s2) else 0.0
    return out


def causal_floor(T: Tensor) -> float:
    """The least relative error of a lower-triangular matrix:
    ``||triu(T, 1)||_F / ||T||_F``."""
    return float(T.triu(1).norm() / T.norm())


def _tail2(A: Tensor, r: int) -> float:
    """``sum_(i > r) s_i(A)^2``: what a rank-r matrix leaves of A (Eckart-Young)."""
    if r >= min(A.shape):
        return 0.0
    s2 = torch.linalg.svdvals(A) ** 2
    return float(s2[r:].sum())


def dyadic_blocks(seqlen: int):
    """The blocks ``(rows, cols)`` (ranges) of the dyadic partition of the
    strict lower triangle: ``[m, b) x [a, m)`` for every interval ``[a, b)`` of
    the recursive halving of ``[0, seqlen)`` (length >= 2), ``m = (a + b) // 2``.
    Pairwise disjoint; each inside the split block ``[m:, :m]``."""
    out, stack = [], [(0, seqlen)]
    while stack:
        a, b = stack.pop()
        if b - a < 2:
            continue
        m = (a + b) // 2
        out.append((range(m, b), range(a, m)))
        stack += [(a, m), (m, b)]
    return out


def semiseparable_floor(T: Tensor, rank: int, two_sided: bool = False) -> float:
    """The least relative error of a matrix whose split blocks ``M[k:, :k]`` (and
    ``M[:k, k:]`` if ``two_sided``) all have rank <= ``rank`` (module docstring).

    Args:
        T (Tensor): (L, L), not all zeros.
        rank (int): r >= 0.
        two_sided (bool): bound the blocks above the diagonal too. Defaults to
            False (only the strict lower triangle is bounded).

    Returns:
        float: ``sqrt(max(split, dyadic)) / ||T||_F``, the larger of the two
        disjoint-block bounds.
    """
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f'rank must be a non-negative int, got {rank!r}')
    T = T.double()
    L = T.shape[0]
    sides = (T, T.T) if two_sided else (T, )
    split = max((sum(_tail2(S[k:, :k], rank) for S in sides) for k in range(1, L)),
                default=0.0)
    dyadic = sum(_tail2(S[rows.start:rows.stop, cols.start:cols.stop], rank)
                 for S in sides for rows, cols in dyadic_blocks(L))
    return float(max(split, dyadic) ** 0.5 / T.norm())


def project_simplex(V: Tensor, total) -> Tensor:
    """Each row of V projected (Euclidean) onto ``{x >= 0, sum x = total}``
    (``total`` >= 0, a scalar or one per row), by the sort-and-threshold rule."""
    V = V.double()
    total = torch.as_tensor(total, dtype=V.dtype).expand(V.shape[0])[:, None]
    U = V.sort(dim=1, descending=True).values
    css = U.cumsum(1) - total
    idx = torch.arange(1, V.shape[1] + 1, dtype=V.dtype)
    cond = U - css / idx > 0
    k = cond.sum(1, keepdim=True).clamp(min=1)
    theta = css.gather(1, k - 1) / k.to(V.dtype)
    return (V - theta).clamp(min=0)


def _cone_error2(T: Tensor, s: float) -> float:
    """``||T - P_s(T)||^2`` with every row of T projected onto ``s`` times the
    simplex (s < 0: onto ``-|s|`` times it)."""
    if s >= 0:
        return float((T - project_simplex(T, s)).pow(2).sum())
    return float((-T - project_simplex(-T, -s)).pow(2).sum())


def row_sum_floor(T: Tensor, nonnegative: bool = False) -> float:
    """The least relative error of a matrix whose rows all have one sum.

    Any M with ``M 1 = s 1``: the projection subtracts ``(r_i - s) / L`` from
    row i (r its row sums), so the error is ``sum_i (r_i - mean r)^2 / L``. With
    ``nonnegative`` (one head of softmax or linear attention: ``a S``, S
    row-stochastic, a real) M lies in the union of two convex cones
    ``{M >= 0, M 1 = s 1}`` and its negative; the squared distance to one is
    convex in s and is minimised by golden-section search on s to 1e-12 of its
    range (the returned floor is the smaller of the minimum found and the
    equal-row-sum floor, which holds for every s).

    Args:
        T (Tensor): (L, L), not all zeros.
        nonnegative (bool): Defaults to False.

    Returns:
        float: the relative error.
    """
    T = T.double()
    L = T.shape[1]
    r = T.sum(1)
    equal = float((r - r.mean()).pow(2).sum() / L)
    best = equal
    if nonnegative:
        # |s| beyond the largest row's l1 norm times 2 only moves away from T
        high = 2 * float(T.abs().sum(1).max()) + 1e-12
        found = []
        for sign in (1.0, -1.0):
            lo, hi = 0.0, high
            g = (5 ** 0.5 - 1) / 2
            a, b = hi - g * (hi - lo), lo + g * (hi - lo)
            fa, fb = _cone_error2(T, sign * a), _cone_error2(T, sign * b)
            while hi - lo > 1e-12 * high:
                if fa <= fb:
                    hi, b, fb = b, a, fa
                    a = hi - g * (hi - lo)
                    fa = _cone_error2(T, sign * a)
                else:
                    lo, a, fa = a, b, fb
                    b = lo + g * (hi - lo)
                    fb = _cone_error2(T, sign * b)
            found.append(min(fa, fb, _cone_error2(T, 0.0)))
        # the minimum of a convex function, found to round-off: never below the
        # equal-row-sum floor, which every cone member obeys
        best = max(equal, min(found))
    return float(best ** 0.5 / T.norm())


# --------------------------------------------------------------------------- #
# The attention of a trained model
# --------------------------------------------------------------------------- #
def trained_attention_image(seqlen: int, patch_size: int,
                            image: Optional[str] = None,
                            seed: int = 0) -> np.ndarray:
    """An RGB image whose patch grid is :func:`grid_shape` (seqlen).

    Args:
        seqlen (int): L, the number of patches.
        patch_size (int): the model's patch side in pixels.
        image (str, optional): an image file, resized (bicubic) to the grid;
            None for one image of the rich toy generator (class 0, drawn from
            ``numpy.random.default_rng(seed)``) at the longer side,
            centre-cropped to the grid.
        seed (int): seed of the toy image. Defaults to 0.

    Returns:
        np.ndarray: (h * patch_size, w * patch_size, 3) uint8.
    """
    h, w = grid_shape(seqlen)
    size = (h * patch_size, w * patch_size)
    if image is not None:
        from PIL import Image
        with Image.open(image) as im:
            return np.asarray(im.convert('RGB').resize(size[::-1], Image.BICUBIC))
    from mmdinomamba.datasets import render_rich_sample
    side = max(size)
    array = render_rich_sample(np.random.default_rng(seed), 0, 12, side)[0]
    top, left = (side - size[0]) // 2, (side - size[1]) // 2
    return np.ascontiguousarray(array[top:top + size[0], left:left + size[1]])


def normalise_image(image: np.ndarray, cfg) -> Tensor:
    """(h, w, 3) uint8 RGB -> (1, 3, h, w) float32 with the config's mean and std
    (its ``model.data_preprocessor`` or ``data_preprocessor``; mmpretrain's
    ImageNet values when it has none)."""
    from mmdinomamba.analysis.images import DEFAULT_PREPROCESSOR
    pre = ((cfg.get('model') or {}).get('data_preprocessor') or
           cfg.get('data_preprocessor') or {})
    if 'mean' not in pre or 'std' not in pre:
        pre = DEFAULT_PREPROCESSOR
    x = torch.from_numpy(image).float().permute(2, 0, 1)
    mean = torch.tensor(pre['mean'], dtype=torch.float32)[:, None, None]
    std = torch.tensor(pre['std'], dtype=torch.float32)[:, None, None]
    return ((x - mean) / std)[None]


def check_attention_head(backbone, layer: int, head: int):
    """The block index and mixer of ``layer``, or a ValueError if the backbone
    has no such layer or the mixer no such head."""
    from mmdinomamba.analysis.adapters import as_backbone, normalise_layers
    from mmdinomamba.analysis.mixing import mixer_info
    api = as_backbone(backbone)
    index = normalise_layers([layer], api.num_layers)[0]
    mixer = api.token_mixer(index)
    nheads = mixer_info(mixer).nheads
    if not (isinstance(head, int) and 0 <= head < nheads):
        raise ValueError(f'head {head} is out of range: layer {layer} has {nheads} '
                         'heads')
    return index, mixer


@torch.no_grad()
def trained_attention(backbone, cfg, seqlen: int, layer: int = -1, head: int = 0,
                      image: Optional[str] = None, seed: int = 0) -> Tensor:
    """One head's mixing matrix among the patches, on an image of L patches.

    The backbone (any the analysis API supports; mmpretrain's ViT and ours
    resize their position embeddings to the grid) reads an image whose patch
    grid is :func:`grid_shape` (seqlen); the head's matrix of the block's
    mixer (:func:`~mmdinomamba.analysis.mixing.mixing_matrices`, float64; the
    first key, e.g. 'attention', or 'combined' for a bidirectional SSD) is cut
    to the patch tokens: the readout and other prefix tokens are dropped, so
    its rows sum to 1 minus their share.

    Args:
        backbone (nn.Module): a loaded backbone.
        cfg (Config): its config (patch size, normalisation).
        seqlen (int): L, the number of patches.
        layer (int): block index, negative from the end. Defaults to -1.
        head (int): head index. Defaults to 0.
        image (str, optional): an image file (see :func:`trained_attention_image`).
        seed (int): seed of the toy image. Defaults to 0.

    Returns:
        Tensor: (seqlen, seqlen) float64.
    """
    from mmdinomamba.analysis.adapters import as_backbone, eval_no_grad
    from mmdinomamba.analysis.loading import backbone_config
    from mmdinomamba.analysis.mixing import mixer_info, mixing_matrices
    api = as_backbone(backbone)
    index, mixer = check_attention_head(backbone, layer, head)
    info = mixer_info(mixer)
    patch = backbone_config(cfg).get('patch_size', 16)
    pixels = normalise_image(trained_attention_image(seqlen, patch, image, seed), cfg)
    with eval_no_grad(api):
        out = api.forward_intermediates(pixels, [index], mixer_inputs=True)
    key = 'combined' if 'combined' in info.keys else info.keys[0]
    layout = out.layout_of(index)  # grid mixers (MLLA) get the block's grid
    M = mixing_matrices(mixer, out.mixer_inputs[index], hw=layout.hw)[key][0, head]
    patches = layout.patches.to(M.device)
    if len(patches) != seqlen:
        raise ValueError(f'the image gave {len(patches)} patches, not {seqlen}')
    return M[patches][:, patches].cpu()
