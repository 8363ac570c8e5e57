"""configs/binary_auc: every config builds; the toy config runs through tools/test.py."""
import glob
import importlib
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmpretrain.registry import DATASETS
from PIL import Image
from sklearn.metrics import roc_auc_score

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.analysis import activation_maps
from mmdinomamba.datasets import encode_rgb_label_map, read_label_map
from mmdinomamba.models import DinoVim

ROOT = osp.abspath(osp.join(osp.dirname(__file__), '..', '..'))
CONFIG_DIR = osp.join(ROOT, 'configs', 'binary_auc')
TOY_CONFIG = osp.join(CONFIG_DIR, 'binary-auc_dinovim-toy-p8_toy.py')
TOY_ADE_CONFIG = osp.join(CONFIG_DIR, 'binary-auc_dinovim-toy-p8_toy-ade.py')
# config -> (backbone class, embed dims, registers, method, dataset, ignore index)
IMAGENET_S = ('ImageNetS', 1000)  # ImageNet-S marks ignored pixels 1000
EXPECTED = {
    'binary-auc_dinovim-tiny-p16_imagenet-s.py': ('DinoVim', 256, 0, 'cosine',
                                                  *IMAGENET_S),
    'binary-auc_dinovim-small-p16_imagenet-s.py': ('DinoVim', 512, 0, 'cosine',
                                                   *IMAGENET_S),
    'binary-auc_dinovim-base-p16_imagenet-s.py': ('DinoVim', 768, 0, 'cosine',
                                                  *IMAGENET_S),
    'binary-auc_dinomamba-reg-base-p16_imagenet-s.py': ('DinoVim', 768, 12, 'cosine',
                                                        *IMAGENET_S),
    'binary-auc_linearvit-base-p16_imagenet-s.py': ('LinearViT', 768, 0, 'cosine',
                                                    *IMAGENET_S),
    'binary-auc_vit-base-p16_imagenet-s.py': ('VisionTransformer', 768, 0, 'cosine',
                                              *IMAGENET_S),
    'binary-auc-attn_vit-base-p16_imagenet-s.py': ('VisionTransformer', 768, 0,
                                                   'attention', *IMAGENET_S),
    'binary-auc_dinovim-toy-p8_toy.py': ('DinoVim', 64, 0, 'cosine', *IMAGENET_S),
    # mmseg: VOC marks object boundaries 255
    'binary-auc_dinovim-base-p16_voc12.py': ('DinoVim', 768, 0, 'cosine',
                                             'PascalVOCDataset', 255),
    'binary-auc_dinovim-toy-p8_toy-ade.py': ('DinoVim', 64, 0, 'cosine',
                                             'BaseSegDataset', 255),
}


def test_every_config_is_listed():
    found = {osp.basename(p) for p in glob.glob(osp.join(CONFIG_DIR, '*.py'))}
    assert found == set(EXPECTED)


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_config_builds(name):
    cfg = Config.fromfile(osp.join(CONFIG_DIR, name))
    backbone, dims, registers, method, dataset, ignore = EXPECTED[name]
    if cfg.default_scope == 'mmseg':
        pytest.importorskip('mmseg.models')  # mmseg with mmcv's compiled ops
    registry = importlib.import_module(f'{cfg.default_scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(cfg.default_scope), torch.device('meta'):
        model = registry.build(cfg.model)
    assert type(model).__name__ == 'ActivationMapModel'
    assert type(model.backbone).__name__ == backbone
    assert model.backbone.embed_dims == dims and model.method == method
    assert getattr(model.backbone, 'num_registers', 0) == registers
    assert cfg.test_dataloader.dataset.type == dataset
    assert not osp.isabs(cfg.test_dataloader.dataset.data_root)
    assert cfg.test_evaluator.type == 'BinaryAUC'
    assert cfg.test_evaluator.ignore_index == ignore


def test_imagenet_s_configs_read_the_imagenet_s_layout(tmp_path):
    image = np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    ids = np.zeros((50, 70), np.int64)
    ids[10:30, 20:60] = 919
    for folder in ('validation', 'validation-segmentation'):
        os.makedirs(tmp_path / folder / 'n01443537')
    Image.fromarray(image).save(tmp_path / 'validation' / 'n01443537' / 'a.JPEG')
    Image.fromarray(encode_rgb_label_map(ids)).save(
        tmp_path / 'validation-segmentation' / 'n01443537' / 'a.png')
    cfg = Config.fromfile(
        osp.join(CONFIG_DIR, 'binary-auc_dinovim-base-p16_imagenet-s.py'))
    cfg.test_dataloader.dataset.data_root = str(tmp_path)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        sample = DATASETS.build(cfg.test_dataloader.dataset)[0]
    assert tuple(sample['inputs'].shape) == (3, 224, 224)
    assert (sample['data_samples'].gt_seg_map == ids).all()


def random_dino_checkpoint(cfg, path):
    """A checkpoint laid out as a DINO run whose student (``backbone.*``) and
    teacher (``teacher.backbone.*``) have different random weights.

    Returns:
        dict: the teacher's backbone state dict.
    """
    backbone_cfg = {k: v for k, v in cfg.model.backbone.items() if k != 'type'}
    torch.manual_seed(1)
    teacher = DinoVim(**backbone_cfg).state_dict()
    torch.manual_seed(2)
    student = DinoVim(**backbone_cfg).state_dict()
    state = {**{f'backbone.{k}': v for k, v in student.items()},
             **{f'teacher.backbone.{k}': v for k, v in teacher.items()}}
    torch.save(dict(state_dict=state, meta=dict()), path)
    return teacher


def independent_binary_auc(cfg, teacher, pairs):
    """Per-head Binary-AUC, mean over images, without the pipeline or the metric.

    Pillow decodes and resizes (bicubic, as the toy configs), the preprocessor's
    mean/std normalise RGB, :func:`activation_maps` gives the maps, and sklearn
    scores them against the label map (foreground = label > 0).

    Args:
        pairs (list[tuple]): (image path, label map path).

    Returns:
        np.ndarray: (heads, ), the mean over images of each head's AUC.
    """
    backbone = DinoVim(**{k: v for k, v in cfg.model.backbone.items() if k != 'type'})
    backbone.load_state_dict(teacher)
    pre = cfg.model.data_preprocessor
    mean = torch.tensor(pre.mean).view(3, 1, 1)
    std = torch.tensor(pre.std).view(3, 1, 1)
    size = cfg.model.backbone.img_size
    batch = []
    for image_path, _ in pairs:
        with Image.open(image_path) as image:
            rgb = np.array(image.convert('RGB').resize((size, size), Image.BICUBIC))
        batch.append((torch.from_numpy(rgb).permute(2, 0, 1).float() - mean) / std)
    # one batch in dataset order, as the test loop runs it: the same float32 ops
    heads = activation_maps(backbone, torch.stack(batch),
                            feature_source=cfg.model.feature_source).heads
    per_image = []
    for maps, (_, label_path) in zip(heads, pairs):
        label = torch.from_numpy(read_label_map(label_path))
        maps = F.interpolate(maps[None], size=tuple(label.shape), mode='bilinear',
                             align_corners=False)[0]
        per_image.append([roc_auc_score(label.numpy().ravel() > 0, m.numpy().ravel())
                          for m in maps])
    return np.mean(per_image, 0)


def assert_metrics_match(metrics, expected):
    # Identical pixels and the same float32 ops in the same batch give the same
    # maps; the rank AUC equals sklearn's to 1e-9. 1e-6 allows a couple of float32
    # near-ties that another thread count could flip: 48 x 48 labels hold ~10^6
    # fg/bg pairs, and one flipped pair moves a 3-image mean by ~4e-7.
    for i, value in enumerate(expected):
        assert metrics[f'binary_auc/head_{i}'] == pytest.approx(value, abs=1e-6)
    assert metrics['binary_auc'] == pytest.approx(expected.mean(), abs=1e-6)


@pytest.fixture(scope='module')
def toy_root(toy_data):
    return toy_data(num_classes=3, train_per_class=1, val_per_class=1, size=48,
                    formats=['imagenet', 'ade'])


@pytest.mark.slow
def test_toy_config_through_tools_test(toy_root, tmp_path):
    cfg = Config.fromfile(TOY_CONFIG)
    ckpt, out = str(tmp_path / 'dino.pth'), str(tmp_path / 'metrics.json')
    teacher = random_dino_checkpoint(cfg, ckpt)
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.run(
        [sys.executable, 'tools/test.py', TOY_CONFIG, ckpt, '--work-dir',
         str(tmp_path / 'work_dir'), '--out', out, '--cfg-options',
         f'test_dataloader.dataset.data_root={toy_root}',
         'test_dataloader.num_workers=0'],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert 'binary_auc:' in log and "from the 'teacher.backbone.' keys" in log
    with open(out) as file:
        metrics = json.load(file)
    assert metrics['binary_auc/num_skipped'] == 0
    assert sorted(k for k in metrics if 'head_' in k) == \
        [f'binary_auc/head_{i}' for i in range(8)]  # 2 * 64 / 16 SSD heads
    with open(osp.join(toy_root, 'meta', 'val.txt')) as file:
        rel_paths = [line.split()[0] for line in file]
    pairs = [(osp.join(toy_root, 'val', rel), osp.join(toy_root, 'masks', 'val', rel))
             for rel in rel_paths]
    assert_metrics_match(metrics, independent_binary_auc(cfg, teacher, pairs))


@pytest.mark.slow
def test_toy_ade_config_through_mmseg_runner(toy_root, tmp_path):
    pytest.importorskip('mmseg.models')  # mmseg with mmcv's compiled ops
    from mmengine.runner import Runner
    cfg = Config.fromfile(TOY_ADE_CONFIG)
    ckpt = str(tmp_path / 'dino.pth')
    teacher = random_dino_checkpoint(cfg, ckpt)
    ade = osp.join(toy_root, 'ade')
    cfg.test_dataloader.dataset.data_root = ade
    cfg.test_dataloader.num_workers = 0
    cfg.work_dir, cfg.load_from = str(tmp_path / 'work_dir'), ckpt
    metrics = Runner.from_cfg(cfg).test()
    assert metrics['binary_auc/num_skipped'] == 0
    stems = sorted(osp.splitext(name)[0] for name in
                   os.listdir(osp.join(ade, 'images', 'validation')))
    assert len(stems) == 3
    pairs = [(osp.join(ade, 'images', 'validation', f'{stem}.jpg'),
              osp.join(ade, 'annotations', 'validation', f'{stem}.png'))
             for stem in stems]
    assert_metrics_match(metrics, independent_binary_auc(cfg, teacher, pairs))
