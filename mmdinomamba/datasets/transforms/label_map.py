"""Load an ImageNet-S style label map (RGB PNG, class id = R + 256 * G)."""
import copy
from typing import Optional

import mmengine.fileio as fileio
from mmcv.transforms import BaseTransform

from mmdinomamba.datasets.label_maps import read_label_map


class LoadRGBLabelMap(BaseTransform):
    """Read ``results['seg_map_path']`` into ``results['gt_seg_map']``.

    RGB(A) files are decoded as ``R + 256 * G`` (ImageNet-S); single-channel files
    hold the ids directly (see :func:`mmdinomamba.datasets.read_label_map`).
    Placed after the image's geometric transforms, the label map keeps its
    original resolution, which is what :class:`mmdinomamba.evaluation.BinaryAUC`
    scores at (it resizes the activation map to the label map).

    Required keys: ``seg_map_path``. Added keys: ``gt_seg_map`` ((height, width)
    int64) and ``'gt_seg_map'`` in ``seg_fields``.

    Args:
        backend_args (dict, optional): file backend arguments of
            :func:`mmengine.fileio.get`. Defaults to None (local files).
    """

    def __init__(self, backend_args: Optional[dict] = None) -> None:
        self.backend_args = copy.deepcopy(backend_args)

    def transform(self, results: dict) -> dict:
        path = results.get('seg_map_path')
        if path is None:
            raise ValueError('LoadRGBLabelMap: the sample has no seg_map_path; use a '
                             'dataset that lists label maps (e.g. ImageNetS)')
        try:
            data = fileio.get(path, backend_args=self.backend_args)
        except FileNotFoundError as err:
            raise FileNotFoundError(f'LoadRGBLabelMap: label map not found: '
                                    f'{path}') from err
        results['gt_seg_map'] = read_label_map(data, name=str(path))
        fields = results.setdefault('seg_fields', [])
        if 'gt_seg_map' not in fields:
            fields.append('gt_seg_map')
        return results

    def __repr__(self) -> str:
        return f'{type(self).__name__}(backend_args={self.backend_args})'
