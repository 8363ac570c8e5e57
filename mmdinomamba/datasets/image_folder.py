"""A folder of images, with or without class folders, for self-supervised training.

Needs mmpretrain (registered through :mod:`mmdinomamba.registry` only).
"""
import logging
import os
import os.path as osp
from multiprocessing.util import Finalize
from typing import List, Optional, Sequence, Set

from mmengine.fileio import list_from_file
from mmengine.logging import print_log
from mmpretrain.datasets import BaseDataset
from PIL import Image

IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff',
                  '.webp')


def unreadable_reason(path: str) -> Optional[str]:
    """Why the image at ``path`` cannot be decoded, or None if it can.

    Decodes the whole file with Pillow, so a truncated file fails too.
    """
    try:
        with Image.open(path) as img:
            img.load()
    except Exception as err:  # Pillow raises OSError, SyntaxError, ValueError, ...
        return f'{type(err).__name__}: {err}'
    return None


class ImageFolder(BaseDataset):
    """Every image under a folder (found recursively), or the images a list names.

    Labels are not needed (DINO ignores them), so any layout works::

        data_root/[split/]**/<name>.<ext>     class folders, nested folders or none
        data_root/meta/<split>.txt            optional list (mmpretrain's ImageNet
                                              layout): '<path> [label]' per line,
                                              paths relative to data_root/split

    With ``ann_file`` (or ``meta/<split>.txt``) the list is read and a line's
    label, if it has one, becomes ``gt_label``; otherwise the folder is scanned
    for files with one of ``extensions`` (sorted, so every rank sees one order).
    An empty folder or list is an error naming it.

    Unreadable images: by default (strict) the first image that cannot be read
    ends the run with an error naming the file. With ``skip_unreadable=True``
    such an image is skipped with a warning naming it, another random image is
    drawn in its place (mmengine's refetch, training only), and each process
    (the main one or a data worker) logs how many it skipped when it ends. An
    image counts as unreadable only if Pillow cannot decode it either, so errors
    of the pipeline itself still end the run.

    Args:
        data_root (str): the dataset root. Defaults to ''.
        split (str): the folder under ``data_root`` holding the images ('' for
            ``data_root`` itself); as in mmpretrain's ``ImageNet``, so an
            ImageNet config switches with ``type='ImageFolder'`` alone.
            Defaults to ''.
        ann_file (str): list of images, relative to ``data_root``; '' reads
            ``meta/<split>.txt`` when ``split`` is set and that file exists, and
            scans the folder otherwise. Defaults to ''.
        extensions (Sequence[str]): image file suffixes (any case) for the scan.
            Defaults to :data:`IMG_EXTENSIONS`.
        skip_unreadable (bool): skip unreadable images instead of failing.
            Defaults to False.
        **kwargs: other arguments of mmpretrain's ``BaseDataset`` (``pipeline``,
            ``test_mode``, ``metainfo``, ...).
    """

    def __init__(self,
                 data_root: str = '',
                 split: str = '',
                 ann_file: str = '',
                 extensions: Sequence[str] = IMG_EXTENSIONS,
                 skip_unreadable: bool = False,
                 **kwargs) -> None:
        if not isinstance(split, str):
            raise ValueError(f'ImageFolder: split must be a folder name (str), got '
                             f'{split!r}')
        if not ann_file and split and osp.isfile(osp.join(data_root, 'meta',
                                                          f'{split}.txt')):
            ann_file = osp.join('meta', f'{split}.txt')
        self.extensions = tuple(e.lower() for e in extensions)
        self.skip_unreadable = skip_unreadable
        # the unreadable images met by this process (the main one or a data
        # worker); `log_skipped()` logs them, and runs by itself at process exit
        self.skipped: List[str] = []
        self._skipped_set: Set[str] = set()
        self._skipping_pid: Optional[int] = None
        self.log_skipped: Optional[Finalize] = None
        super().__init__(ann_file=ann_file, data_root=data_root, data_prefix=split,
                         **kwargs)

    def load_data_list(self) -> List[dict]:
        """One ``dict(img_path=...)`` per image (plus ``gt_label`` if listed)."""
        root = self.img_prefix
        if self.ann_file:
            if not osp.isfile(self.ann_file):
                raise FileNotFoundError(f'ImageFolder: image list {self.ann_file} '
                                        'does not exist')
            data_list = []
            for line in map(str.strip, list_from_file(self.ann_file)):
                path, _, label = line.rpartition(' ')
                if path and label.lstrip('-').isdigit():  # '<path> <label>'
                    data_list.append(dict(img_path=osp.join(root, path),
                                          gt_label=int(label)))
                elif line:
                    data_list.append(dict(img_path=osp.join(root, line)))
            if not data_list:
                raise ValueError(f'ImageFolder: the image list {self.ann_file} is '
                                 'empty; list one image per line, or remove it (and '
                                 'leave ann_file empty) to scan the folder')
            return data_list
        if not osp.isdir(root):
            raise FileNotFoundError(f'ImageFolder: image folder {root} does not exist')
        paths = []
        for folder, dirs, files in os.walk(root, followlinks=True):
            dirs.sort()
            paths += [osp.join(folder, f) for f in sorted(files)
                      if f.lower().endswith(self.extensions)]
        if not paths:
            raise ValueError(f'ImageFolder: found no images under {root} (searched '
                             f'recursively for {", ".join(self.extensions)})')
        return [dict(img_path=p) for p in paths]

    def prepare_data(self, idx: int):
        """The pipeline's output for image ``idx``; None to skip an unreadable image."""
        path = self.get_data_info(idx)['img_path']
        if self._skipping_pid == os.getpid() and path in self._skipped_set:
            return None  # known unreadable: warned about already
        try:
            return super().prepare_data(idx)
        except Exception as err:
            reason = unreadable_reason(path)
            if reason is None:
                raise  # the file decodes: the error is not the image's
            if not self.skip_unreadable:
                raise ValueError(f'ImageFolder: cannot read image {path} ({reason}); '
                                 'set skip_unreadable=True in the dataset to skip '
                                 'unreadable images') from err
        if self._skipping_pid != os.getpid():  # the first skip of this process
            self._skipping_pid = os.getpid()
            self.skipped, self._skipped_set = [], set()
            self.log_skipped = Finalize(None, self._log_skipped, exitpriority=10)
        self.skipped.append(path)
        self._skipped_set.add(path)
        print_log(f'ImageFolder: skipping unreadable image {path} ({reason}); '
                  f'{len(self.skipped)} skipped in this process', logger='current',
                  level=logging.WARNING)
        return None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state['log_skipped'] = None  # the exit hook belongs to this process
        return state

    def _log_skipped(self) -> None:
        print_log(f'ImageFolder: skipped {len(self.skipped)} unreadable image(s) in '
                  f'process {os.getpid()}: {", ".join(self.skipped)}',
                  logger='current', level=logging.WARNING)
