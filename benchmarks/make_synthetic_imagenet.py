"""Write random JPEGs in ImageNet's training layout, for timing the training loop.

    python benchmarks/make_synthetic_imagenet.py data/synthetic_imagenet 1440

gives ``ROOT/train/<wnid>/<wnid>_<i>.JPEG`` (300 x 400 px, eight classes) and
``ROOT/meta/train.txt``: what ``configs/dino/*`` read with
``train_dataloader.dataset.data_root=ROOT``. The pixels are noise: the files
measure speed (decoding, cropping, the step), not learning.
"""
import argparse
import os
import os.path as osp

import numpy as np
from PIL import Image

WNIDS = ('n01440764', 'n01443537', 'n01484850', 'n01491361', 'n01494475', 'n01496331',
         'n01498041', 'n01514668')


def make(root: str, num_images: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(num_images):
        wnid = WNIDS[i % len(WNIDS)]
        os.makedirs(osp.join(root, 'train', wnid), exist_ok=True)
        name = f'{wnid}/{wnid}_{i}.JPEG'
        Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(
            osp.join(root, 'train', name), quality=90)
        lines.append(f'{name} {i % len(WNIDS)}')
    os.makedirs(osp.join(root, 'meta'), exist_ok=True)
    tmp = osp.join(root, 'meta', 'train.txt.tmp')
    with open(tmp, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    os.replace(tmp, osp.join(root, 'meta', 'train.txt'))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('root')
    parser.add_argument('num_images', type=int)
    args = parser.parse_args(argv)
    if args.num_images < 1:
        raise SystemExit('make_synthetic_imagenet: num_images must be >= 1')
    make(args.root, args.num_images)


if __name__ == '__main__':
    main()
