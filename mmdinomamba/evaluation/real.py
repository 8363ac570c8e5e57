"""ReaL: top-1 accuracy on the ImageNet val set against the Reassessed Labels.

"Are we done with ImageNet?" (Beyer et al., 2020, https://arxiv.org/abs/2006.07159)
relabelled the 50,000 ImageNet val images: ``real.json`` (from
github.com/google-research/reassessed-imagenet) is a JSON list with one entry per
val image, in file-name order (entry ``k`` belongs to
``ILSVRC2012_val_{k+1:08d}.JPEG``); each entry is the list of the 1000-way classes
that are a correct answer for the image, and an empty list means that no label
fits (the image is excluded, 3,163 of them in the published file). A top-1
prediction is correct when it is in the image's list:

    ReaL = #{k : labels_k non-empty and pred_k in labels_k} / #{k : labels_k non-empty}

Images are matched to entries by their file name, so the val set may be laid out
in class folders or flat with ``meta/val.txt``, in any order.
"""
import json
import os.path as osp
import re
from typing import Dict, List, Optional, Sequence

import torch
from mmengine.evaluator import BaseMetric

__all__ = ['ReaLAccuracy', 'load_real_labels', 'val_image_index']

_VAL_NAME = re.compile(r'ILSVRC2012_val_(\d{8})\.[A-Za-z]+$')


def val_image_index(img_path: str) -> int:
    """The 0-based index of an ImageNet val image, read from its file name.

    Args:
        img_path (str): path ending in ``ILSVRC2012_val_NNNNNNNN.<ext>``.

    Returns:
        int: ``NNNNNNNN - 1``.
    """
    match = _VAL_NAME.search(osp.basename(img_path))
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f'ReaL: cannot tell which val image {img_path!r} is: '
                         f'ReaL labels are matched by the file name '
                         f'ILSVRC2012_val_NNNNNNNN.JPEG (NNNNNNNN from 00000001)')
    return int(match.group(1)) - 1


def load_real_labels(path: str, num_classes: int = 1000) -> List[List[int]]:
    """Read and check ``real.json``.

    Args:
        path (str): the JSON file: a list with one list of class indices per val
            image.
        num_classes (int): labels must lie in ``[0, num_classes)``. Defaults to
            1000.

    Returns:
        list[list[int]]: the label lists, in val file-name order.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'ReaL: labels file not found: {path!r} (the '
                                f'real.json of google-research/reassessed-imagenet)')
    with open(path, encoding='utf-8') as f:
        labels = json.load(f)
    if not isinstance(labels, list):
        raise ValueError(f'ReaL: {path} must hold a JSON list (one list of labels '
                         f'per val image), got {type(labels).__name__}')
    for k, entry in enumerate(labels):
        if not isinstance(entry, list) or not all(
                isinstance(c, int) and not isinstance(c, bool)
                and 0 <= c < num_classes for c in entry):
            raise ValueError(f'ReaL: entry {k} of {path} must be a list of class '
                             f'indices in [0, {num_classes}), got {entry!r}')
    return labels


class ReaLAccuracy(BaseMetric):
    """Top-1 accuracy against the Reassessed Labels of the ImageNet val set.

    Reads each sample's ``pred_label`` and ``img_path`` (mmpretrain's
    ``PackInputs`` keeps ``img_path`` by default). Returns, under the prefix
    ``real/``: ``top1`` (percent correct among the images with labels),
    ``scored`` (their number) and ``excluded`` (evaluated images whose label list
    is empty).

    Args:
        real_file (str): path of ``real.json``; its length must equal the number
            of images of the evaluated dataset (50,000 for the val set).
        num_classes (int): number of classes of the classifier. Defaults to 1000.
        collect_device (str): 'cpu' or 'gpu', where results are gathered in
            distributed runs. Defaults to 'cpu'.
        prefix (str, optional): metric name prefix. Defaults to 'real'.
    """

    default_prefix: Optional[str] = 'real'

    def __init__(self,
                 real_file: str,
                 num_classes: int = 1000,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.real_file = real_file
        self.labels = load_real_labels(real_file, num_classes)

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        """Store (val index, top-1 prediction) of each sample of the batch."""
        for sample in data_samples:
            if 'pred_label' not in sample or 'img_path' not in sample:
                raise ValueError('ReaLAccuracy needs pred_label and img_path in '
                                 'each data sample')
            index = val_image_index(sample['img_path'])
            if index >= len(self.labels):
                raise ValueError(
                    f'ReaL: {sample["img_path"]} is val image {index + 1}, but '
                    f'{self.real_file} has only {len(self.labels)} entries')
            pred = int(torch.as_tensor(sample['pred_label']).reshape(-1)[0])
            self.results.append((index, pred))

    def evaluate(self, size: int) -> dict:
        """Check that ``real.json`` covers the evaluated dataset, then score it.

        Args:
            size (int): number of images in the evaluated dataset.
        """
        if size != len(self.labels):
            raise ValueError(f'ReaL: {self.real_file} has {len(self.labels)} '
                             f'entries but the evaluated val set has {size} images; '
                             f'they must match (one entry per val image)')
        return super().evaluate(size)

    def compute_metrics(self, results: list) -> Dict[str, float]:
        """ReaL top-1 over the images with a non-empty label list."""
        indices = [index for index, _ in results]
        if len(set(indices)) != len(indices):
            raise ValueError('ReaL: two evaluated images have the same val file '
                             'number')
        scored = correct = 0
        for index, pred in results:
            if self.labels[index]:
                scored += 1
                correct += pred in self.labels[index]
        if scored == 0:
            raise ValueError('ReaL: every evaluated image has an empty label list')
        return {'top1': 100.0 * correct / scored, 'scored': scored,
                'excluded': len(results) - scored}
