"""Tiny generated copies of the robustness sets, in their published layouts.

Shared by tests/datasets, tests/evaluation, tests/configs and tests/tools.
"""
import json
import os
import os.path as osp
from typing import Dict, List, Sequence

import numpy as np
from PIL import Image

from mmdinomamba.datasets.imagenet_wnids import IMAGENET_WNIDS

README = 'README.txt'  # ImageNet-A and ImageNet-R ship one next to the class folders


def write_image(path: str, seed: int) -> None:
    """A random 12 x 10 RGB image (JPEG or PNG by the extension)."""
    os.makedirs(osp.dirname(path), exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (10, 12, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def make_wnid_folders(root: str, counts: Dict[int, int], ext: str = '.jpg',
                      readme: bool = True) -> Dict[str, List[str]]:
    """``root/<wnid>/<k><ext>`` for each 1000-way class index and image count.

    Returns:
        dict: wnid -> sorted image paths.
    """
    files = {}
    for index, count in counts.items():
        wnid = IMAGENET_WNIDS[index]
        files[wnid] = [osp.join(root, wnid, f'{wnid}_{k}{ext}') for k in range(count)]
        for k, path in enumerate(files[wnid]):
            write_image(path, seed=1000 * index + k)
    if readme:
        with open(osp.join(root, README), 'w') as f:
            f.write('class folders named by WordNet id\n')
    return files


def make_val_set(root: str, labels: Sequence[int], flat: bool = False) -> List[str]:
    """ImageNet val images ``ILSVRC2012_val_{k+1:08d}.JPEG`` with the given labels.

    ``flat=False``: mmpretrain's class-folder layout ``val/<wnid>/<name>``, with
    all 1000 class folders (mmpretrain's ``ImageNet`` numbers them in sorted order);
    ``flat=True``: ``val/<name>`` plus ``meta/val.txt``, listed in reverse order.
    Either way the dataset's order is not the file-number order.

    Returns:
        list[str]: the image paths, in file-number order.
    """
    paths, lines = [], []
    if not flat:
        for wnid in IMAGENET_WNIDS:
            os.makedirs(osp.join(root, 'val', wnid), exist_ok=True)
    for k, label in enumerate(labels):
        name = f'ILSVRC2012_val_{k + 1:08d}.JPEG'
        rel = name if flat else osp.join(IMAGENET_WNIDS[label], name)
        paths.append(osp.join(root, 'val', rel))
        write_image(paths[-1], seed=k)
        lines.append(f'{rel} {label}')
    if flat:
        os.makedirs(osp.join(root, 'meta'), exist_ok=True)
        with open(osp.join(root, 'meta', 'val.txt'), 'w') as f:
            f.write('\n'.join(reversed(lines)) + '\n')
    return paths


def make_real_json(path: str, real: Sequence[Sequence[int]]) -> None:
    """Write ``real.json``: one list of labels per val image."""
    with open(path, 'w') as f:
        json.dump([list(map(int, entry)) for entry in real], f)


ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
ROBUSTNESS_CONFIGS = osp.join(ROOT, 'configs', 'robustness')
# A DinoVim small enough for a CPU second, on top of the DinoVim-T robustness
# configs: 2 blocks of width 32, the last block read out.
TINY_OVERRIDES = """
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=32, num_layers=2),
                  out_indices=[-1], frozen_stages=2,
                  mixer_cfg=dict(d_state=8, headdim=16, ssd_backend='quadratic')),
    neck=dict(in_channels=32),
    head=dict(in_channels=32))
test_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(data_root={root!r}))
"""


def write_tiny_configs(config_dir: str, roots: Dict[str, str],
                       real_file: str) -> Dict[str, str]:
    """``<config_dir>/tiny_<suffix>.py`` for each robustness set of ``roots``.

    Args:
        roots (dict): config suffix (``in-a``, ...) -> data root.
        real_file (str): the ReaL labels for ``in-real``.

    Returns:
        dict: suffix -> config path.
    """
    os.makedirs(config_dir, exist_ok=True)
    paths = {}
    for suffix, root in roots.items():
        base = osp.join(ROBUSTNESS_CONFIGS, f'dinovim-tiny-p16_{suffix}.py')
        text = f'_base_ = {base!r}\n' + TINY_OVERRIDES.format(root=root)
        if suffix == 'in-real':
            text += f'test_evaluator = dict(real_file={real_file!r})\n'
        paths[suffix] = osp.join(config_dir, f'tiny_{suffix}.py')
        with open(paths[suffix], 'w') as f:
            f.write(text)
    return paths


def make_robustness_sets(root: str) -> dict:
    """Tiny copies of all four sets whose classes are disjoint between sets.

    Returns:
        dict: ``roots`` (suffix -> data root), ``real_file``, ``real`` (the
        label lists), ``files`` (suffix -> {wnid: paths}; ``in-real``: the val
        labels) and ``classes`` (suffix -> the 1000-way indices present).
    """
    classes = {'in-sketch': [7, 300, 812], 'in-a': [41, 512, 950], 'in-r': [2, 99, 640]}
    counts = {'in-sketch': [2, 3, 1], 'in-a': [3, 1, 2], 'in-r': [1, 2, 2]}
    roots = {'in-sketch': osp.join(root, 'imagenet-sketch'),
             'in-a': osp.join(root, 'imagenet-a'),
             'in-r': osp.join(root, 'imagenet-r'),
             'in-real': osp.join(root, 'imagenet')}
    files = {
        'in-sketch': make_wnid_folders(osp.join(roots['in-sketch'], 'sketch'),
                                       dict(zip(classes['in-sketch'], counts['in-sketch'])),
                                       ext='.JPEG', readme=False),
        'in-a': make_wnid_folders(roots['in-a'], dict(zip(classes['in-a'], counts['in-a']))),
        'in-r': make_wnid_folders(roots['in-r'], dict(zip(classes['in-r'], counts['in-r']))),
    }
    val_labels = [7, 3, 300, 7, 5, 812, 7, 1]
    make_val_set(roots['in-real'], val_labels, flat=True)
    real = [[7], [], [300, 7], [1], [], [812], [7, 8], [1, 2]]
    real_file = osp.join(roots['in-real'], 'real.json')
    make_real_json(real_file, real)
    files['in-real'] = val_labels
    return dict(roots=roots, real_file=real_file, real=real, files=files,
                classes=classes)


def constant_logit_checkpoint(config: str, path: str, bias: Sequence[float]) -> None:
    """A checkpoint of ``config``'s model whose head ignores the features.

    The linear head's weight is zero, so the logits of every image are ``bias``
    and the predictions follow from ``bias`` alone.
    """
    import torch
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(Config.fromfile(config).model)
    model.head.fc.weight.data.zero_()
    model.head.fc.bias.data.copy_(torch.as_tensor(bias))
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), path)


def expected_row(data: dict, bias: Sequence[float]) -> Dict[str, float]:
    """Each set's percent for constant logits ``bias``, one image at a time.

    Sketch and ReaL predict the largest of all 1000 logits; ImageNet-A and -R
    the largest among the classes present in the set.
    """
    def best(candidates):
        return max(candidates, key=lambda c: bias[c])

    row = {}
    for suffix in ('in-sketch', 'in-a', 'in-r'):
        pred = best(range(1000) if suffix == 'in-sketch' else data['classes'][suffix])
        files = data['files'][suffix]
        total = sum(len(paths) for paths in files.values())
        row[suffix] = 100.0 * len(files.get(IMAGENET_WNIDS[pred], [])) / total
    pred = best(range(1000))
    labelled = [labels for labels in data['real'] if labels]
    row['in-real'] = 100.0 * sum(pred in labels for labels in labelled) / len(labelled)
    return row
