"""Binary-AUC: how well an activation map separates foreground from background.

The paper's recipe, per image:

1. normalise the activation map to [0, 1] (min-max over the scored pixels);
2. merge the label map into a binary mask: foreground = every label that is not in
   ``background_indices``; pixels equal to ``ignore_index`` belong to neither class;
3. sweep a threshold t over [0, 1]; a pixel is covered when its score is >= t;
   TPR(t) = covered share of the foreground, FPR(t) = covered share of the background;
4. integrate the ROC curve (TPR against FPR) by the trapezoid rule.

1.0 means every foreground pixel scores above every background pixel, 0.5 is chance,
0.0 is a perfectly inverted map. Images whose foreground is empty or covers every
scored pixel have no ROC curve; they are skipped and counted.

Two modes share one definition:

- ``thresholds=N``: the paper's sweep of N evenly spaced thresholds
  ``t_k = k / (N - 1)``, k = 0..N-1 (both ends included), plus the point (0, 0)
  (a threshold above every score) that closes the curve;
- ``thresholds=None``: the exact AUC, i.e. the Mann-Whitney statistic
  ``P(s_fg > s_bg) + P(s_fg == s_bg) / 2``, which equals
  ``sklearn.metrics.roc_auc_score(fg_mask, score_map)``. It is invariant to any
  strictly increasing transform of the scores, so the normalisation is skipped.

Relation between the two: the trapezoid over N thresholds equals the exact AUC of
the scores *quantised* to the threshold grid (each score replaced by the number of
thresholds it reaches), since the trapezoid counts a foreground/background pair that
falls between the same two neighbouring thresholds as a tie (1/2). The error of the
sweep is therefore at most half the share of foreground/background pairs that share a
bin (see :func:`threshold_error_bound`), about ``1 / (2 (N - 1))`` times the overlap
of the two score densities.
"""
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from mmengine.evaluator import BaseMetric
from mmengine.logging import MMLogger

__all__ = [
    'BinaryAUC', 'binary_auc', 'binary_auc_batch', 'foreground_mask', 'roc_curve',
    'threshold_error_bound'
]


def _valid_mask(fg_mask: torch.Tensor, valid: Optional[torch.Tensor]) -> torch.Tensor:
    """``valid``, or all True, checked against the shape of ``fg_mask``."""
    if valid is None:
        return torch.ones_like(fg_mask, dtype=torch.bool)
    if valid.shape != fg_mask.shape:
        raise ValueError(f'valid shape {tuple(valid.shape)} differs from '
                         f'fg_mask shape {tuple(fg_mask.shape)}')
    return valid


def _check_inputs(score_map: torch.Tensor, fg_mask: torch.Tensor,
                  valid: Optional[torch.Tensor]) -> torch.Tensor:
    """Validate one image's inputs and return the flat boolean valid mask."""
    if score_map.shape != fg_mask.shape:
        raise ValueError(f'score_map shape {tuple(score_map.shape)} differs from '
                         f'fg_mask shape {tuple(fg_mask.shape)}')
    valid = _valid_mask(fg_mask, valid)
    if not torch.isfinite(score_map[valid.bool()]).all():
        raise ValueError('score_map holds non-finite values (nan or inf) on '
                         'scored pixels')
    return valid.reshape(-1).bool()


def _check_thresholds(thresholds: Optional[int]) -> None:
    if thresholds is not None and (isinstance(thresholds, bool)
                                   or not isinstance(thresholds, int)
                                   or thresholds < 2):
        raise ValueError('thresholds must be None (exact AUC) or an int >= 2 '
                         f'(number of evenly spaced thresholds), got '
                         f'{thresholds!r}')


def _normalise(scores: torch.Tensor) -> torch.Tensor:
    """Min-max normalise a flat score vector to [0, 1]; a constant one maps to 0.

    Args:
        scores (Tensor): (num_pixels, ), float64.

    Returns:
        Tensor: (num_pixels, ) in [0, 1]; the minimum is exactly 0 and the
        maximum exactly 1 unless all scores are equal.
    """
    low, high = scores.min(), scores.max()
    if high <= low:
        return torch.zeros_like(scores)
    return (scores - low) / (high - low)


def _quantise(scores: torch.Tensor, thresholds: int) -> torch.Tensor:
    """How many of the N grid thresholds ``k / (N - 1)`` each score reaches.

    Args:
        scores (Tensor): (num_pixels, ) in [0, 1], float64.
        thresholds (int): N.

    Returns:
        Tensor: (num_pixels, ) int64 in [1, N] (t_0 = 0 is reached by all).
    """
    grid = torch.linspace(0, 1, thresholds, dtype=scores.dtype,
                          device=scores.device)
    return torch.searchsorted(grid, scores, right=True)


def _flat_scored(score_map, fg_mask, valid, thresholds):
    """Shared preamble: flat float64 scores and boolean labels of scored pixels."""
    _check_thresholds(thresholds)
    keep = _check_inputs(score_map, fg_mask, valid)
    scores = score_map.reshape(-1)[keep].double()
    labels = fg_mask.reshape(-1)[keep].bool()
    return scores, labels


def roc_curve(score_map: torch.Tensor,
              fg_mask: torch.Tensor,
              valid: Optional[torch.Tensor] = None,
              thresholds: int = 100) -> Tuple[torch.Tensor, torch.Tensor]:
    """The paper's ROC polyline from N evenly spaced thresholds.

    The scores of the valid pixels are min-max normalised to [0, 1] first.

    Args:
        score_map (Tensor): (height, width) or any shape, activation map.
        fg_mask (Tensor): same shape, bool (or 0/1), True = foreground.
        valid (Tensor, optional): same shape, bool, False = ignored pixel.
        thresholds (int): N >= 2 thresholds ``k / (N - 1)``, k = 0..N-1.

    Returns:
        tuple[Tensor, Tensor]: ``fpr`` and ``tpr``, each (N + 1, ) float64,
        from the highest threshold to the lowest: point 0 is (0, 0) (a threshold
        above every score), point k >= 1 is threshold t_{N-k}, so point N is
        t_0 = 0, i.e. (1, 1). Entries are nan when the foreground (tpr) or the
        background (fpr) is empty.
    """
    if thresholds is None:
        raise ValueError('roc_curve needs an int number of thresholds, got None')
    scores, labels = _flat_scored(score_map, fg_mask, valid, thresholds)
    if scores.numel() == 0:
        nan = torch.full((thresholds + 1, ), float('nan'), dtype=torch.float64)
        return nan, nan.clone()
    bins = _quantise(_normalise(scores), thresholds)
    # hist[c] = pixels reaching exactly c thresholds, c = 0..N (0 never occurs).
    fg_hist = torch.bincount(bins[labels], minlength=thresholds + 1)
    bg_hist = torch.bincount(bins[~labels], minlength=thresholds + 1)
    # Covered at t_k <=> reaches more than k thresholds. Reversed suffix sums give
    # the counts for k = N-1 .. 0; prepend the empty point (0, 0).
    zero = fg_hist.new_zeros(1)
    tp = torch.cat([zero, fg_hist.flip(0).cumsum(0)[:-1]])
    fp = torch.cat([zero, bg_hist.flip(0).cumsum(0)[:-1]])
    # 0 / 0 gives nan when a class is empty, as documented.
    num_fg, num_bg = tp[-1].double(), fp[-1].double()
    return fp.double() / num_bg, tp.double() / num_fg


def _rank_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Mann-Whitney AUC with ties counted 1/2, from integer counts per tie group.

    Args:
        scores (Tensor): (num_pixels, ), any ordered dtype.
        labels (Tensor): (num_pixels, ), bool, True = foreground.

    Returns:
        float: ``sum_g fg_g * (bg_below_g + bg_g / 2) / (num_fg * num_bg)``
        over groups g of equal score, or nan when a class is empty.
    """
    num_fg = int(labels.sum())
    num_bg = labels.numel() - num_fg
    if num_fg == 0 or num_bg == 0:
        return float('nan')
    order = torch.argsort(scores)
    _, group, sizes = torch.unique_consecutive(scores[order], return_inverse=True,
                                               return_counts=True)
    fg_per_group = torch.zeros_like(sizes).index_add_(0, group,
                                                      labels[order].long())
    bg_per_group = sizes - fg_per_group
    bg_below = bg_per_group.cumsum(0) - bg_per_group
    # Doubled to stay in integers: 2 * wins + ties.
    twice_wins = (fg_per_group * (2 * bg_below + bg_per_group)).sum()
    return float(twice_wins.double() / (2.0 * num_fg * num_bg))


def binary_auc(score_map: torch.Tensor,
               fg_mask: torch.Tensor,
               valid: Optional[torch.Tensor] = None,
               thresholds: Optional[int] = None) -> float:
    """Binary-AUC of one activation map against one foreground mask.

    Args:
        score_map (Tensor): (height, width) or any shape, activation map (higher =
            more foreground). Must be finite on valid pixels.
        fg_mask (Tensor): same shape, bool (or 0/1), True = foreground.
        valid (Tensor, optional): same shape, bool, False = ignored pixel (in
            neither class, not used for the normalisation). Defaults to all True.
        thresholds (int, optional): None for the exact AUC (equals sklearn's
            ``roc_auc_score``, ties count 1/2); N >= 2 for the paper's trapezoid
            over N evenly spaced thresholds in [0, 1] after min-max normalisation.

    Returns:
        float: AUC in [0, 1], or nan when the valid foreground or the valid
        background is empty.

    Raises:
        ValueError: shapes differ, non-finite scores, or a bad ``thresholds``.
    """
    if thresholds is None:
        scores, labels = _flat_scored(score_map, fg_mask, valid, thresholds)
        return _rank_auc(scores, labels)
    fpr, tpr = roc_curve(score_map, fg_mask, valid, thresholds)
    if torch.isnan(fpr[0]) or torch.isnan(tpr[0]):
        return float('nan')
    return float(torch.trapezoid(tpr, fpr))


def binary_auc_batch(score_maps: torch.Tensor,
                     fg_mask: torch.Tensor,
                     valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Exact Binary-AUC of many maps at once: ``binary_auc(thresholds=None)`` of
    every map, on the maps' device (one sort, no Python loop over maps).

    The same Mann-Whitney count as :func:`binary_auc`, per row of pixels: sort each
    map, cut it into groups of equal score, and sum
    ``fg_g * (bg_below_g + bg_g / 2)`` over the groups, where ``bg_below_g`` counts
    the background pixels of lower groups of the same map. Ignored pixels count in
    neither class.

    Args:
        score_maps (Tensor): (batch, num_maps, height, width), several maps of
            each image. Must be finite on valid pixels.
        fg_mask (Tensor): (batch, height, width) bool, True = foreground, shared by
            the maps of an image.
        valid (Tensor, optional): (batch, height, width) bool, False = ignored
            pixel. Defaults to all True.

    Returns:
        Tensor: (batch, num_maps) float64, nan where an image's valid foreground
        or background is empty.
    """
    if score_maps.dim() != 4 or score_maps.shape[:1] + score_maps.shape[2:] != \
            fg_mask.shape:
        raise ValueError(f'score_maps must be (batch, num_maps, height, width) with '
                         f'fg_mask (batch, height, width); got '
                         f'{tuple(score_maps.shape)} and {tuple(fg_mask.shape)}')
    valid = _valid_mask(fg_mask, valid)
    batch, num_maps = score_maps.shape[:2]
    fg, valid = fg_mask.bool().to(score_maps.device), valid.bool().to(score_maps.device)
    scored = valid[:, None].expand_as(score_maps)
    if not torch.isfinite(score_maps[scored]).all():
        raise ValueError('score_maps hold non-finite values (nan or inf) on scored '
                         'pixels')
    rows = batch * num_maps
    # ignored pixels get a finite score and weight 0 in both classes
    scores = torch.where(scored, score_maps, 0).reshape(rows, -1)
    is_fg = (fg & valid)[:, None].expand_as(score_maps).reshape(rows, -1)
    is_bg = (~fg & valid)[:, None].expand_as(score_maps).reshape(rows, -1)
    scores, order = scores.sort(dim=1)
    is_fg, is_bg = is_fg.gather(1, order).long(), is_bg.gather(1, order).long()
    starts = torch.ones_like(scores, dtype=torch.bool)
    starts[:, 1:] = scores[:, 1:] != scores[:, :-1]
    group = starts.reshape(-1).cumsum(0) - 1  # global ids, rows one after another
    num_groups = int(group[-1]) + 1
    fg_g = torch.zeros(num_groups, dtype=torch.long, device=scores.device)
    fg_g.index_add_(0, group, is_fg.reshape(-1))
    bg_g = torch.zeros_like(fg_g).index_add_(0, group, is_bg.reshape(-1))
    row_of_group = torch.arange(rows, device=scores.device).repeat_interleave(
        starts.sum(1))
    below = bg_g.cumsum(0) - bg_g  # background of all earlier groups, any row
    first = group.reshape(rows, -1)[:, 0]
    bg_below = below - below[first][row_of_group]
    # doubled to stay in integers: 2 * wins + ties
    twice_wins = torch.zeros(rows, dtype=torch.long, device=scores.device)
    twice_wins.index_add_(0, row_of_group, fg_g * (2 * bg_below + bg_g))
    num_fg, num_bg = is_fg.sum(1), is_bg.sum(1)
    auc = twice_wins.double() / (2.0 * num_fg * num_bg)
    auc[(num_fg == 0) | (num_bg == 0)] = float('nan')
    return auc.reshape(batch, num_maps)


def _pairs_sharing(keys: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Number of (foreground, background) pixel pairs with equal ``keys``.

    Args:
        keys (Tensor): (num_pixels, ), any ordered dtype.
        labels (Tensor): (num_pixels, ), bool, True = foreground.

    Returns:
        Tensor: scalar int64.
    """
    _, group = torch.unique(keys, return_inverse=True)
    fg = torch.bincount(group[labels], minlength=int(group.max()) + 1)
    bg = torch.bincount(group[~labels], minlength=int(group.max()) + 1)
    return (fg * bg).sum()


def threshold_error_bound(score_map: torch.Tensor,
                          fg_mask: torch.Tensor,
                          valid: Optional[torch.Tensor] = None,
                          thresholds: int = 100) -> float:
    """Upper bound on ``|binary_auc(thresholds=N) - binary_auc(thresholds=None)|``.

    The N-threshold trapezoid is the exact AUC of the quantised scores, so the two
    differ only on foreground/background pairs that fall into the same bin with
    different scores: each such pair counts 1/2 instead of 0 or 1. Hence the error
    is at most ``(pairs sharing a bin - pairs sharing a score) / (2 num_fg num_bg)``.
    For score densities f_fg, f_bg on [0, 1] this is about
    ``integral(f_fg * f_bg) / (2 (N - 1))``.

    Args:
        score_map (Tensor): as in :func:`binary_auc`.
        fg_mask (Tensor): as in :func:`binary_auc`.
        valid (Tensor, optional): as in :func:`binary_auc`.
        thresholds (int): N >= 2.

    Returns:
        float: the bound, or nan when a class is empty.
    """
    scores, labels = _flat_scored(score_map, fg_mask, valid, thresholds)
    num_fg = int(labels.sum())
    num_bg = labels.numel() - num_fg
    if num_fg == 0 or num_bg == 0:
        return float('nan')
    scores = _normalise(scores)
    loose = _pairs_sharing(_quantise(scores, thresholds), labels) - \
        _pairs_sharing(scores, labels)
    return float(loose.double() / (2.0 * num_fg * num_bg))


def foreground_mask(label_map: torch.Tensor,
                    background_indices: Sequence[int] = (0, ),
                    ignore_index: Optional[int] = 255
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge a label map into a binary foreground mask and a valid mask.

    Args:
        label_map (Tensor): (height, width), integer class ids.
        background_indices (Sequence[int]): labels that count as background.
        ignore_index (int, optional): label of pixels in neither class.

    Returns:
        tuple[Tensor, Tensor]: ``fg_mask`` and ``valid``, both (height, width) bool.
    """
    label_map = label_map.long()
    background = torch.zeros_like(label_map, dtype=torch.bool)
    for index in background_indices:
        background |= label_map == index
    valid = torch.ones_like(background) if ignore_index is None else \
        label_map != ignore_index
    return valid & ~background, valid


def _lookup(sample: Any, keys: Sequence[str], what: str) -> Any:
    """The first of the dotted ``keys`` present in a dict-like data sample.

    A value that is a ``PixelData``-like element (or its ``to_dict()`` form) is
    unwrapped to its ``data`` field.
    """
    for key in keys:
        value = sample
        for part in key.split('.'):
            if isinstance(value, Mapping):
                value = value.get(part)
            else:
                value = getattr(value, part, None)
            if value is None:
                break
        if value is None:
            continue
        if not isinstance(value, torch.Tensor) and not hasattr(value, '__array__'):
            if isinstance(value, Mapping) and 'data' in value:
                value = value['data']
            elif hasattr(value, 'data'):
                value = value.data
        try:
            return torch.as_tensor(value)
        except (TypeError, RuntimeError, ValueError) as err:
            raise ValueError(f'BinaryAUC: {what} under {key!r} is not an array: '
                             f'{type(value).__name__}') from err
    available = list(sample.keys()) if hasattr(sample, 'keys') else \
        [k for k in dir(sample) if not k.startswith('_')]
    raise ValueError(f'BinaryAUC: no {what} in the data sample under any of the '
                     f'keys {list(keys)}; available keys: {available}')


def _as_keys(key: Union[str, Sequence[str]], name: str) -> Tuple[str, ...]:
    keys = (key, ) if isinstance(key, str) else tuple(key)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f'{name} must be a non-empty str or a sequence of them, '
                         f'got {key!r}')
    return keys


class BinaryAUC(BaseMetric):
    """Binary-AUC of activation maps against segmentation labels, mean over images.

    Each data sample must hold an activation map, (height, width) or
    (heads, height, width), and a label map, (height, width) or (1, height, width).
    A map of another spatial size than the labels is resized bilinearly to them.
    Values are fractions in [0, 1] (not percentages).

    Keys of ``compute_metrics``:

    - ``binary_auc``: mean over images (of the mean over heads, when per head);
    - ``binary_auc/head_{i}``: mean over images of head i (``per_head=True``);
    - ``binary_auc/num_skipped``: images skipped for an empty or full foreground.

    Args:
        thresholds (int, optional): None = exact AUC (default); N = the paper's
            trapezoid over N evenly spaced thresholds (e.g. 100).
        background_indices (Sequence[int]): labels merged into background.
        ignore_index (int, optional): label excluded from both classes.
        pred_key (str | Sequence[str]): dotted key(s) of the activation map in a
            data sample; the first present is used. ``PixelData`` (or its dict
            form) is unwrapped to its ``data``.
        gt_key (str | Sequence[str]): dotted key(s) of the label map. The default
            reads ``gt_seg_map`` (dict-like mmpretrain samples) or mmseg's
            ``gt_sem_seg`` (``SegDataSample``).
        per_head (bool): score each head of a (heads, height, width) map and
            report ``binary_auc/head_{i}``; if False, the heads are averaged into
            one map first.
        collect_device (str): 'cpu' or 'gpu', see ``BaseMetric``.
        prefix (str, optional): prefix of the metric names, see ``BaseMetric``.
        collect_dir (str, optional): see ``BaseMetric``.
    """

    # the keys carry their own name (binary_auc, binary_auc/...): no prefix by
    # default, and '' rather than None so that mmengine does not warn "The prefix is
    # not set" on every run (a given ``prefix`` still goes in front)
    default_prefix: Optional[str] = ''

    def __init__(self,
                 thresholds: Optional[int] = None,
                 background_indices: Sequence[int] = (0, ),
                 ignore_index: Optional[int] = 255,
                 pred_key: Union[str, Sequence[str]] = 'activation_map',
                 gt_key: Union[str, Sequence[str]] = ('gt_seg_map', 'gt_sem_seg'),
                 per_head: bool = True,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None,
                 collect_dir: Optional[str] = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix,
                         collect_dir=collect_dir)
        _check_thresholds(thresholds)
        if not all(isinstance(i, int) for i in background_indices):
            raise ValueError('background_indices must be ints, got '
                             f'{background_indices!r}')
        if ignore_index is not None and ignore_index in background_indices:
            raise ValueError(f'ignore_index {ignore_index} is also listed in '
                             f'background_indices {tuple(background_indices)}')
        self.thresholds = thresholds
        self.background_indices = tuple(background_indices)
        self.ignore_index = ignore_index
        self.pred_keys = _as_keys(pred_key, 'pred_key')
        self.gt_keys = _as_keys(gt_key, 'gt_key')
        self.per_head = per_head

    def _maps(self, sample: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        """Activation maps (heads, height, width) resized to the label map.

        Returns:
            tuple[Tensor, Tensor]: maps (heads, height, width) float and label map
            (height, width).
        """
        score = _lookup(sample, self.pred_keys, 'activation map')
        label = _lookup(sample, self.gt_keys, 'label map')
        if label.dim() == 3 and label.shape[0] == 1:
            label = label[0]
        if label.dim() != 2 or label.numel() == 0:
            raise ValueError('BinaryAUC: label map must be (height, width) or '
                             f'(1, height, width), got {tuple(label.shape)}')
        if score.dim() == 2:
            score = score[None]
        if score.dim() != 3 or score.numel() == 0:
            raise ValueError('BinaryAUC: activation map must be (height, width) '
                             f'or (heads, height, width), got {tuple(score.shape)}')
        score = score.detach()
        if not score.is_floating_point():
            score = score.float()
        if not torch.isfinite(score).all():
            raise ValueError('BinaryAUC: activation map holds non-finite values')
        if not self.per_head:
            score = score.mean(0, keepdim=True)
        if score.shape[-2:] != label.shape:
            score = F.interpolate(score[None], size=tuple(label.shape),
                                  mode='bilinear', align_corners=False)[0]
        return score, label.to(score.device)

    def process(self, data_batch: Any, data_samples: Sequence[dict]) -> None:
        """Score each sample and store one tuple of per-head floats per image.

        A skipped image (empty or full foreground) stores an empty tuple.
        """
        for sample in data_samples:
            score, label = self._maps(sample)
            fg_mask, valid = foreground_mask(label, self.background_indices,
                                             self.ignore_index)
            aucs = tuple(
                binary_auc(head, fg_mask, valid, self.thresholds)
                for head in score)
            if any(a != a for a in aucs):  # nan: a class is empty
                aucs = ()
            self.results.append(aucs)

    def compute_metrics(self, results: List[Tuple[float, ...]]) -> Dict[str, float]:
        """Mean Binary-AUC over the scored images (fractions in [0, 1])."""
        scored = [r for r in results if r]
        num_skipped = len(results) - len(scored)
        logger = MMLogger.get_current_instance()
        if num_skipped:
            logger.info(f'BinaryAUC: skipped {num_skipped} of {len(results)} '
                        'images whose foreground is empty or covers every '
                        'scored pixel')
        metrics: Dict[str, float] = {'binary_auc/num_skipped': num_skipped}
        if not scored:
            logger.warning('BinaryAUC: no image could be scored; binary_auc is nan')
            metrics['binary_auc'] = float('nan')
            return metrics
        num_heads = {len(r) for r in scored}
        if len(num_heads) != 1:
            raise ValueError('BinaryAUC: activation maps have different head '
                             f'counts across images: {sorted(num_heads)}')
        per_head = torch.tensor(scored, dtype=torch.float64).mean(0)
        metrics['binary_auc'] = float(per_head.mean())
        if self.per_head and per_head.numel() > 1:
            for i, value in enumerate(per_head.tolist()):
                metrics[f'binary_auc/head_{i}'] = value
        return metrics
