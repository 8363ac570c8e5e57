"""Weighted k-NN classification on frozen features, DINO's protocol.

Caron et al., "Emerging Properties in Self-Supervised Vision Transformers"
(https://arxiv.org/abs/2104.14294), section 4.1 and its ``eval_knn.py``: every
feature is L2-normalised; for a query q the k training features with the highest
cosine similarity s_i = <q, x_i> vote for their labels with weight exp(s_i / T)::

    score_c(q) = sum_{i in top-k(q)} exp(s_i / T) [y_i == c]
    prediction(q) = argmax_c score_c(q)

with k = 20 and T = 0.07 in the paper. Ties in ``argmax`` go to the lowest class
id (``torch.argmax``'s rule).

Words for the shapes: ``num_train`` training (bank) features, ``num_query`` query
features, ``dim`` channels, ``num_classes`` classes.
"""
from typing import Optional

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

__all__ = ['knn_classify', 'knn_accuracy']


def _check(train_feats: Tensor, train_labels: Tensor, query_feats: Tensor, k: int,
           temperature: float) -> None:
    if train_feats.dim() != 2 or query_feats.dim() != 2 or \
            train_feats.shape[1] != query_feats.shape[1]:
        raise ValueError('train_feats must be (num_train, dim) and query_feats '
                         '(num_query, dim) with the same dim, got '
                         f'{tuple(train_feats.shape)} and {tuple(query_feats.shape)}')
    if train_labels.shape != train_feats.shape[:1]:
        raise ValueError(f'train_labels must be (num_train,) = ({train_feats.shape[0]},)'
                         f', got {tuple(train_labels.shape)}')
    if train_labels.dtype.is_floating_point or train_labels.dtype == torch.bool or \
            (train_labels.numel() and int(train_labels.min()) < 0):
        raise ValueError('train_labels must hold non-negative integer class ids')
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f'k must be a positive int, got {k!r}')
    if not temperature > 0:
        raise ValueError(f'temperature must be > 0, got {temperature!r}')
    if train_feats.shape[0] == 0:
        raise ValueError('the k-NN bank (train_feats) is empty')


def knn_classify(train_feats: Tensor,
                 train_labels: Tensor,
                 query_feats: Tensor,
                 k: int = 20,
                 temperature: float = 0.07,
                 num_classes: Optional[int] = None,
                 chunk: int = 1024) -> Tensor:
    """Temperature-weighted k-NN predictions (see the module docstring).

    Args:
        train_feats (Tensor): (num_train, dim) bank features (any scale; they are
            L2-normalised here).
        train_labels (Tensor): (num_train,) integer class ids.
        query_feats (Tensor): (num_query, dim) features to classify.
        k (int): neighbours; ``min(k, num_train)`` are used. Defaults to 20.
        temperature (float): T of the vote weights exp(s / T). Defaults to 0.07.
        num_classes (int, optional): classes; None = ``max(train_labels) + 1``.
        chunk (int): queries per similarity block (memory). Defaults to 1024.

    Returns:
        Tensor: (num_query,) int64 predicted class ids.
    """
    _check(train_feats, train_labels, query_feats, k, temperature)
    num_classes = int(train_labels.max()) + 1 if num_classes is None else num_classes
    bank = F.normalize(train_feats.float(), dim=1)
    labels = train_labels.long().to(bank.device)
    kk = min(k, bank.shape[0])
    preds = []
    for start in range(0, query_feats.shape[0], chunk):
        q = F.normalize(query_feats[start:start + chunk].float().to(bank.device), dim=1)
        sims, idx = (q @ bank.T).topk(kk, dim=1)
        votes = torch.zeros(q.shape[0], num_classes, device=bank.device)
        votes.scatter_add_(1, labels[idx], (sims / temperature).exp())
        preds.append(votes.argmax(dim=1))
    if not preds:
        return torch.zeros(0, dtype=torch.long, device=bank.device)
    return torch.cat(preds)


def knn_accuracy(train_feats: Tensor,
                 train_labels: Tensor,
                 query_feats: Tensor,
                 query_labels: Tensor,
                 k: int = 20,
                 temperature: float = 0.07) -> Tensor:
    """Per-query correctness of :func:`knn_classify` (for bootstrap intervals).

    Args:
        train_feats (Tensor): (num_train, dim).
        train_labels (Tensor): (num_train,) class ids.
        query_feats (Tensor): (num_query, dim).
        query_labels (Tensor): (num_query,) class ids.
        k (int): neighbours. Defaults to 20.
        temperature (float): vote temperature. Defaults to 0.07.

    Returns:
        Tensor: (num_query,) float64, 1.0 where the prediction is right; its mean
        is the top-1 accuracy.
    """
    if query_labels.shape != query_feats.shape[:1]:
        raise ValueError(f'query_labels must be (num_query,) = ({query_feats.shape[0]},)'
                         f', got {tuple(query_labels.shape)}')
    _check(train_feats, train_labels, query_feats, k, temperature)
    num_classes = int(train_labels.max()) + 1
    if query_labels.numel():
        num_classes = max(num_classes, int(query_labels.max()) + 1)
    preds = knn_classify(train_feats, train_labels, query_feats, k, temperature,
                         num_classes)
    return (preds.cpu() == query_labels.long().cpu()).double()
