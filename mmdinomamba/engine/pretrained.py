"""A clear error, before training starts, for a pretraining checkpoint that is missing.

The dense and linear-probe configs load a backbone through
``init_cfg=dict(type='Pretrained', checkpoint=PATH)``; when PATH does not exist,
mmengine fails at the first ``init_weights`` with ``FileNotFoundError: PATH can
not be found``. :func:`check_pretrained_checkpoints` names the config key, the
commands that make the file and how to train without it.
"""
import glob
import os.path as osp
import re
from typing import Iterator, Optional, Tuple

from mmengine.config import Config


def _pretrained_inits(node, path: str) -> Iterator[Tuple[str, dict]]:
    """(dotted key, init_cfg) of every ``type='Pretrained'`` init_cfg below ``node``."""
    if isinstance(node, dict):
        init = node.get('init_cfg')
        inits = init if isinstance(init, (list, tuple)) else [init]
        for i, item in enumerate(inits):
            if isinstance(item, dict) and item.get('type') == 'Pretrained':
                key = f'{path}.init_cfg' + (f'.{i}' if isinstance(init, (list, tuple))
                                             else '')
                yield key, item
        for name, value in node.items():
            if name != 'init_cfg':
                yield from _pretrained_inits(value, f'{path}.{name}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _pretrained_inits(value, f'{path}.{i}')


# The official MLLA ImageNet-1k weights (github LeapLabTHU/MLLA, README), under the
# names the dense MLLA configs give them; the MLLA backbone converts them on load.
MLLA_WEIGHTS = {
    'mlla-tiny_in1k.pth': 'https://cloud.tsinghua.edu.cn/f/7a19712877cb4242889c/?dl=1',
    'mlla-small_in1k.pth': 'https://cloud.tsinghua.edu.cn/f/0e5d0b1409d540aaa80c/?dl=1',
    'mlla-base_in1k.pth': 'https://cloud.tsinghua.edu.cn/f/91c85c5a1061496d8796/?dl=1',
}


def _how_to_make(checkpoint: str, config_root: Optional[str]) -> str:
    """The commands that produce ``checkpoint``, as precise as the names allow."""
    name = osp.basename(checkpoint)
    if name in MLLA_WEIGHTS:
        return ('download the official MLLA weights (the backbone converts them '
                'on load; docs/mlla.md):\n'
                f'    wget -O {checkpoint} "{MLLA_WEIGHTS[name]}"')
    work_dir = re.match(r'(?:.*/)?work_dirs/([^/]+)/[^/]+\.pth$', checkpoint)
    if work_dir and config_root:  # a training run's checkpoint (linear probes)
        found = glob.glob(osp.join(config_root, '*', work_dir.group(1) + '.py'))
        if found:
            config = osp.relpath(found[0], osp.dirname(config_root))
            return f'it is written by training {config}:\n    python tools/train.py {config}'
    stem = name.split('_dino')[0]  # e.g. dinovim-tiny-p16 of dinovim-tiny-p16_dino-in1k.pth
    dino = sorted(glob.glob(osp.join(config_root, 'dino', f'dino_{stem}_*.py'))) \
        if config_root else []
    config = osp.relpath(dino[0], osp.dirname(config_root)) if dino \
        else 'configs/dino/dino_<backbone>_<recipe>.py'
    run = f'work_dirs/{osp.splitext(osp.basename(config))[0]}'
    return ('make it by DINO pretraining and keeping the teacher backbone:\n'
            f'    bash tools/dist_train.sh {config} GPUS\n'
            f'    python tools/model_converters/extract_teacher.py {run}/epoch_100.pth '
            f'{checkpoint}\n'
            'or convert an official Dino-Mamba checkpoint:\n'
            f'    python tools/model_converters/dinomamba2mmdinomamba.py CHECKPOINT '
            f'{checkpoint}')


def check_pretrained_checkpoints(cfg: Config, config_root: Optional[str] = None) -> None:
    """Raise if a local ``Pretrained`` checkpoint of ``cfg.model`` does not exist.

    Args:
        cfg (Config): the training config.
        config_root (str, optional): the repository's ``configs`` folder, to name
            the config that produces the checkpoint.

    Raises:
        FileNotFoundError: naming the key, the file, the commands that make it,
            and ``--cfg-options <key>=None`` to train from scratch.
    """
    for key, init in _pretrained_inits(cfg.get('model') or {}, 'model'):
        checkpoint = init.get('checkpoint')
        if not isinstance(checkpoint, str) or '://' in checkpoint \
                or osp.isfile(checkpoint):
            continue
        raise FileNotFoundError(
            f'{key}.checkpoint: the pretrained weights {checkpoint!r} do not exist '
            f'(paths are relative to {osp.abspath(".")}). '
            f'{_how_to_make(checkpoint, config_root)}\n'
            f'Or point the config elsewhere: --cfg-options {key}.checkpoint=PATH; '
            f'or train from scratch: --cfg-options {key}=None')
