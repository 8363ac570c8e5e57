"""RGB label maps (id = R + 256 * G) and their reader."""
import numpy as np
import pytest
from PIL import Image

from mmdinomamba.datasets import (decode_rgb_label_map, encode_rgb_label_map,
                                  read_label_map)


def test_decode_is_r_plus_256_g():
    rgb = np.zeros((2, 3, 3), np.uint8)
    rgb[0, 0] = (7, 0, 99)      # B is ignored
    rgb[0, 1] = (232, 3, 0)     # 232 + 3 * 256 = 1000, ImageNet-S "ignore"
    rgb[1, 2] = (255, 255, 0)   # the largest id
    assert decode_rgb_label_map(rgb).tolist() == [[7, 1000, 0], [0, 0, 65535]]


def test_encode_decode_are_inverse():
    ids = np.random.default_rng(0).integers(0, 65536, (5, 7))
    rgb = encode_rgb_label_map(ids)
    assert rgb.dtype == np.uint8 and rgb.shape == (5, 7, 3)
    assert (decode_rgb_label_map(rgb) == ids).all()
    # RGBA files decode the same
    rgba = np.concatenate([rgb, np.full((5, 7, 1), 255, np.uint8)], -1)
    assert (decode_rgb_label_map(rgba) == ids).all()


def test_read_label_map_modes(tmp_path):
    ids = np.random.default_rng(1).integers(0, 1200, (6, 4))
    Image.fromarray(encode_rgb_label_map(ids)).save(tmp_path / 'rgb.png')
    assert (read_label_map(str(tmp_path / 'rgb.png')) == ids).all()
    grey = (ids % 256).astype(np.uint8)
    Image.fromarray(grey).save(tmp_path / 'grey.png')
    assert (read_label_map(str(tmp_path / 'grey.png')) == grey).all()
    palette = Image.fromarray(grey).convert('P')
    palette.save(tmp_path / 'palette.png')  # VOC style: the index is the id
    with open(tmp_path / 'palette.png', 'rb') as file:
        assert (read_label_map(file.read()) == np.array(palette)).all()


def test_errors(tmp_path):
    with pytest.raises(ValueError, match='uint8'):
        decode_rgb_label_map(np.zeros((2, 2, 3), np.int32))
    with pytest.raises(ValueError, match=r'\[0, 65535\]'):
        encode_rgb_label_map(np.array([[70000]]))
    with pytest.raises(ValueError, match='integer'):
        encode_rgb_label_map(np.zeros((2, 2)))
    (tmp_path / 'bad.png').write_bytes(b'not a png')
    with pytest.raises(ValueError, match='bad.png'):
        read_label_map(str(tmp_path / 'bad.png'))
    Image.fromarray(np.zeros((2, 2), np.float32)).save(tmp_path / 'float.tiff')
    with pytest.raises(ValueError, match="mode 'F'"):
        read_label_map(str(tmp_path / 'float.tiff'))
