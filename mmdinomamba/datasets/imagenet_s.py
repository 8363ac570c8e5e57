"""ImageNet-S: ImageNet images with semantic label maps, for Binary-AUC.

"Large-scale Unsupervised Semantic Segmentation" (Gao et al., TPAMI 2022),
https://arxiv.org/abs/2106.03149. Needs mmpretrain (registered through
:mod:`mmdinomamba.registry` only).
"""
import os.path as osp
from typing import List, Optional

from mmengine.fileio import LocalBackend, get_file_backend
from mmpretrain.datasets import CustomDataset

DEFAULT_PREFIX = dict(img_path='validation', seg_map_path='validation-segmentation')


class ImageNetS(CustomDataset):
    """Images in class folders plus a label map per image, at the mirrored path.

    Layout of ImageNet-S (``data_root`` = ``.../ImageNetS919``, or the 50/300
    class subsets)::

        validation/<wnid>/<name>.JPEG
        validation-segmentation/<wnid>/<name>.png    RGB, id = R + 256 * G

    The label map of image ``<img_path>/<rel>.<ext>`` is
    ``<seg_map_path>/<rel><seg_map_suffix>``. Ids: 0 background, 1..919 classes,
    1000 ignored (score with ``BinaryAUC(ignore_index=1000)``). The toy dataset
    (``tools/make_toy_data.py``) has the same structure with
    ``data_prefix=dict(img_path='val', seg_map_path='masks/val')`` and
    ``ann_file='meta/val.txt'``.

    Each data info holds ``img_path``, ``seg_map_path`` and ``gt_label``; a
    pipeline with :class:`~mmdinomamba.datasets.transforms.LoadRGBLabelMap` and
    ``PackInputs(algorithm_keys=['gt_seg_map'])`` hands the label map to
    :class:`~mmdinomamba.evaluation.BinaryAUC`.

    Args:
        data_root (str): dataset root. Defaults to ''.
        data_prefix (dict, optional): ``img_path`` and ``seg_map_path`` folders,
            relative to ``data_root``. Defaults to ``validation`` and
            ``validation-segmentation``.
        ann_file (str): optional annotation file (``<rel path> <label>`` per line);
            without it the class folders are scanned. Defaults to ''.
        seg_map_suffix (str): file suffix of the label maps. Defaults to '.png'.
        **kwargs: other arguments of mmpretrain's ``CustomDataset`` (``pipeline``,
            ``classes``, ``test_mode``, ...).
    """

    def __init__(self,
                 data_root: str = '',
                 data_prefix: Optional[dict] = None,
                 ann_file: str = '',
                 seg_map_suffix: str = '.png',
                 **kwargs) -> None:
        data_prefix = dict(DEFAULT_PREFIX if data_prefix is None else data_prefix)
        missing = {'img_path', 'seg_map_path'} - set(data_prefix)
        if missing:
            raise ValueError(f'ImageNetS: data_prefix needs keys img_path and '
                             f'seg_map_path; missing {sorted(missing)}')
        self.seg_map_suffix = seg_map_suffix
        super().__init__(data_root=data_root, data_prefix=data_prefix,
                         ann_file=ann_file, **kwargs)

    def load_data_list(self) -> List[dict]:
        """Image infos of mmpretrain's ``CustomDataset`` plus ``seg_map_path``."""
        data_list = super().load_data_list()
        img_prefix = self.data_prefix['img_path']
        seg_prefix = self.data_prefix['seg_map_path']
        backend = get_file_backend(seg_prefix, enable_singleton=True)
        for info in data_list:
            rel = osp.relpath(info['img_path'], img_prefix)
            info['seg_map_path'] = backend.join_path(
                seg_prefix, osp.splitext(rel)[0] + self.seg_map_suffix)
        if isinstance(backend, LocalBackend):  # check now, not mid-evaluation
            if not osp.isdir(seg_prefix):
                raise FileNotFoundError(f'ImageNetS: label map folder not found: '
                                        f'{seg_prefix}')
            absent = [i['seg_map_path'] for i in data_list
                      if not osp.isfile(i['seg_map_path'])]
            if absent:
                raise FileNotFoundError(
                    f'ImageNetS: {len(absent)} of {len(data_list)} label maps are '
                    f'missing under {seg_prefix}, e.g. {absent[:3]}')
        return data_list
