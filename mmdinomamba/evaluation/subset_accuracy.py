"""Top-1 accuracy of a 1000-way classifier on a subset of its classes.

ImageNet-A and ImageNet-R hold 200 of the 1000 ImageNet classes. Their authors
score an ImageNet classifier on them by keeping only the logits of those 200
classes: the prediction is

    pred = subset[argmax_j score[subset[j]]]

and an image counts as correct when ``pred`` is its label. The scores may be logits
or softmax probabilities: the softmax is increasing, so the restricted argmax is the
same. The subset comes from the dataset's metainfo (``imagenet_subset``, set by
:class:`~mmdinomamba.datasets.robustness.ImageNetA` and ``ImageNetR`` from their
class folders), so it is written down nowhere else.
"""
from typing import Dict, List, Optional, Sequence

import torch
from mmengine.evaluator import BaseMetric

__all__ = ['SubsetAccuracy', 'subset_predictions']


def subset_predictions(scores: torch.Tensor, subset: Sequence[int]) -> torch.Tensor:
    """The class among ``subset`` with the highest score, per image.

    Args:
        scores (Tensor): (batch, num_classes) logits or probabilities.
        subset (Sequence[int]): class indices in ``[0, num_classes)``, distinct.

    Returns:
        Tensor: (batch, ) int64, class indices in the full label space (each one
        of ``subset``). Ties go to the class listed first in ``subset``.
    """
    if scores.ndim != 2:
        raise ValueError(f'scores must be (batch, num_classes), got shape '
                         f'{tuple(scores.shape)}')
    index = torch.as_tensor(subset, dtype=torch.long, device=scores.device)
    if index.ndim != 1 or index.numel() == 0:
        raise ValueError('subset must be a non-empty list of class indices')
    if index.unique().numel() != index.numel():
        raise ValueError('subset holds repeated class indices')
    if index.min() < 0 or index.max() >= scores.shape[1]:
        raise ValueError(f'subset indices must lie in [0, {scores.shape[1]}) '
                         f'(the number of scores), got {index.min().item()}..'
                         f'{index.max().item()}')
    return index[scores.index_select(1, index).argmax(dim=1)]


class SubsetAccuracy(BaseMetric):
    """Top-1 accuracy with the scores restricted to the dataset's classes.

    Reads ``dataset_meta['imagenet_subset']`` (set by the evaluator from the test
    dataset) and each sample's ``pred_score`` (num_classes, ) and ``gt_label``.
    Returns ``{'top1': percent correct, 'images': number scored}`` under the
    prefix ``subset/``.

    Args:
        collect_device (str): 'cpu' or 'gpu', where results are gathered in
            distributed runs. Defaults to 'cpu'.
        prefix (str, optional): metric name prefix. Defaults to 'subset'.
    """

    default_prefix: Optional[str] = 'subset'

    def _subset(self) -> List[int]:
        meta = self.dataset_meta or {}
        if 'imagenet_subset' not in meta:
            raise ValueError(
                'SubsetAccuracy needs the dataset metainfo key imagenet_subset '
                '(the 1000-way indices of the classes to score), which '
                'ImageNetA and ImageNetR set; this dataset has keys '
                f'{sorted(meta)}')
        return list(meta['imagenet_subset'])

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        """Store (restricted prediction, label) of each sample of the batch."""
        subset = self._subset()
        if any('pred_score' not in s for s in data_samples):
            raise ValueError('SubsetAccuracy needs pred_score (the classifier '
                             'scores of every class) in each data sample')
        scores = torch.stack([torch.as_tensor(s['pred_score']).reshape(-1).cpu()
                              for s in data_samples])
        labels = torch.stack([torch.as_tensor(s['gt_label']).reshape(-1)[0].cpu()
                              for s in data_samples])
        outside = sorted(set(labels.tolist()) - set(subset))
        if outside:
            raise ValueError(f'SubsetAccuracy: labels {outside[:5]} are not in '
                             f'the dataset\'s imagenet_subset')
        preds = subset_predictions(scores, subset)
        self.results.extend(zip(preds.tolist(), labels.tolist()))

    def compute_metrics(self, results: list) -> Dict[str, float]:
        """Percent of images whose restricted prediction is their label."""
        if not results:
            raise ValueError('SubsetAccuracy: no image was scored')
        correct = sum(pred == label for pred, label in results)
        return {'top1': 100.0 * correct / len(results), 'images': len(results)}
