"""ImageNet-Sketch, ImageNet-A and ImageNet-R: ImageNet classifiers off distribution.

- ImageNet-Sketch (Wang et al., NeurIPS 2019, https://arxiv.org/abs/1905.13549):
  about 50,000 sketches of the 1000 ImageNet classes, scored 1000-way.
- ImageNet-A (Hendrycks et al., CVPR 2021, https://arxiv.org/abs/1907.07174):
  7,500 natural adversarial photos of 200 ImageNet classes.
- ImageNet-R (Hendrycks et al., ICCV 2021, https://arxiv.org/abs/2006.16241):
  30,000 renditions (art, cartoons, ...) of 200 ImageNet classes.

All three are published as one folder per class, named by the class's WordNet id.
Every image gets the 1000-way ImageNet label of its folder
(:func:`~mmdinomamba.datasets.imagenet_wnids.imagenet_class_index`, the one mapping
from ids to indices), so the labels and the classifier share one label space.
ImageNet-A and ImageNet-R also put ``imagenet_subset`` into their metainfo: the
sorted 1000-way indices of their class folders. The authors score a 1000-way
classifier on them by restricting its logits to those classes, which is what
:class:`~mmdinomamba.evaluation.subset_accuracy.SubsetAccuracy` reads it for.

Needs mmpretrain (registered through :mod:`mmdinomamba.registry` only).
"""
import os.path as osp
from typing import List, Tuple, Union

from mmengine.fileio import LocalBackend, get_file_backend
from mmengine.logging import MMLogger
from mmpretrain.datasets import CustomDataset
from mmpretrain.datasets.categories import IMAGENET_CATEGORIES
from mmpretrain.datasets.custom import find_folders, get_samples

from .imagenet_wnids import imagenet_class_index

__all__ = ['ImageNetWnidFolders', 'ImageNetSketch', 'ImageNetA', 'ImageNetR']


class ImageNetWnidFolders(CustomDataset):
    """Images in class folders named by ImageNet-1k WordNet ids.

    Layout (``data_root`` joined with ``data_prefix``)::

        <wnid>/<any name>.<jpg|jpeg|png|...>    e.g. n01443537/0.jpg

    Files next to the class folders (the datasets' ``README.txt``) are ignored;
    images in nested folders below a class folder belong to that class.

    Each data info holds ``img_path`` and ``gt_label``, the 1000-way index of the
    folder's id. ``classes`` are mmpretrain's 1000 ``IMAGENET_CATEGORIES``. When
    ``restrict_to_subset`` is true (ImageNet-A, ImageNet-R), the metainfo also
    holds ``imagenet_subset``: the sorted 1000-way indices of all class folders.

    Args:
        data_root (str): dataset root. Defaults to ''.
        data_prefix (str | dict): folder of the class folders, relative to
            ``data_root``. Defaults to ''.
        **kwargs: other arguments of mmpretrain's ``CustomDataset``
            (``pipeline``, ``extensions``, ``test_mode``, ``indices``, ...);
            there is no ``ann_file``: the class folders are the annotation.

    Raises:
        FileNotFoundError: if the folder is missing or holds no class folder or
            no image.
        ValueError: if a class folder is not named by an ImageNet-1k WordNet id.
    """

    METAINFO = {'classes': IMAGENET_CATEGORIES}
    #: restrict the scoring to the classes present (``imagenet_subset``)
    restrict_to_subset: bool = False
    #: number of classes of the published dataset (a different count is logged)
    published_classes: int = 1000

    def __init__(self,
                 data_root: str = '',
                 data_prefix: Union[str, dict] = '',
                 **kwargs) -> None:
        super().__init__(data_root=data_root, data_prefix=data_prefix,
                         ann_file='', with_label=True, **kwargs)

    def _find_samples(self) -> List[Tuple[str, int]]:
        """(relative image path, 1000-way label) of every image, sorted by path."""
        name = type(self).__name__
        root = self.img_prefix
        backend = get_file_backend(root, enable_singleton=True)
        if isinstance(backend, LocalBackend) and not osp.isdir(root):
            raise FileNotFoundError(
                f'{name}: image folder not found: {root!r} (expected one folder '
                f'per class, named by its ImageNet WordNet id, e.g. '
                f'{osp.join(root, "n01443537")})')
        wnids, _ = find_folders(root, backend)
        if not wnids:
            raise FileNotFoundError(f'{name}: no class folders in {root!r}')
        try:
            folder_to_idx = imagenet_class_index(wnids)
        except ValueError as err:
            raise ValueError(f'{name}: the class folders of {root!r} must be '
                             f'ImageNet class ids: {err}') from None
        samples, empty = get_samples(root, folder_to_idx, self.is_valid_file,
                                     backend)
        if not samples:
            raise FileNotFoundError(
                f'{name}: no images with extensions {sorted(self.extensions)} in '
                f'the {len(wnids)} class folders of {root!r}')
        logger = MMLogger.get_current_instance()
        if empty:
            logger.warning(f'{name}: {len(empty)} class folders without images, '
                           f'e.g. {sorted(empty)[:5]}')
        if len(wnids) != self.published_classes:
            logger.warning(f'{name}: {len(wnids)} class folders in {root}; the '
                           f'published set has {self.published_classes}')
        if self.restrict_to_subset:
            self._metainfo['imagenet_subset'] = sorted(folder_to_idx.values())
        return samples


class ImageNetSketch(ImageNetWnidFolders):
    """ImageNet-Sketch: sketches of the 1000 ImageNet classes, scored 1000-way.

    Published layout (``ImageNet-Sketch.zip`` unpacked into ``data_root``)::

        sketch/n01440764/*.JPEG ... sketch/n15075141/*.JPEG    1000 folders

    Args:
        data_root (str): dataset root. Defaults to ''.
        data_prefix (str | dict): folder of the class folders. Defaults to
            'sketch'.
        **kwargs: see :class:`ImageNetWnidFolders`.
    """

    def __init__(self,
                 data_root: str = '',
                 data_prefix: Union[str, dict] = 'sketch',
                 **kwargs) -> None:
        super().__init__(data_root=data_root, data_prefix=data_prefix, **kwargs)


class ImageNetA(ImageNetWnidFolders):
    """ImageNet-A: natural adversarial examples of 200 classes, scored on them.

    Published layout (``imagenet-a.tar`` unpacked; ``data_root`` = ``imagenet-a``)::

        README.txt
        n01498041/*.jpg ... n12267677/*.jpg    200 folders

    Args:
        data_root (str): dataset root. Defaults to ''.
        data_prefix (str | dict): folder of the class folders. Defaults to ''.
        **kwargs: see :class:`ImageNetWnidFolders`.
    """

    restrict_to_subset = True
    published_classes = 200


class ImageNetR(ImageNetWnidFolders):
    """ImageNet-R: renditions of 200 classes, scored on them.

    Published layout (``imagenet-r.tar`` unpacked; ``data_root`` = ``imagenet-r``)::

        README.txt
        n01443537/*.jpg ... n12267677/*.jpg    200 folders

    Args:
        data_root (str): dataset root. Defaults to ''.
        data_prefix (str | dict): folder of the class folders. Defaults to ''.
        **kwargs: see :class:`ImageNetWnidFolders`.
    """

    restrict_to_subset = True
    published_classes = 200
