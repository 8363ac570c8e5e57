"""benchmarks/make_synthetic_imagenet.py: the layout the DINO configs read."""
import os.path as osp

import pytest
from PIL import Image


def test_writes_the_imagenet_training_layout(load_tool, tmp_path):
    tool = load_tool('benchmarks/make_synthetic_imagenet.py')
    tool.main([str(tmp_path), '10'])
    lines = (tmp_path / 'meta' / 'train.txt').read_text().splitlines()
    assert len(lines) == 10
    for line in lines:
        name, label = line.split()
        wnid = name.split('/')[0]
        assert int(label) == tool.WNIDS.index(wnid)
        with Image.open(osp.join(tmp_path, 'train', name)) as img:
            assert img.size == (400, 300) and img.mode == 'RGB'
    with pytest.raises(SystemExit, match='num_images'):
        tool.main([str(tmp_path), '0'])
