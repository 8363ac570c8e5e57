"""Every UperNet, Cascade Mask R-CNN and Mask R-CNN config trains and evaluates on
toy data.

For each config under ``configs/upernet/``, ``configs/cascade_mask_rcnn/`` and
``configs/mask_rcnn/`` (``_base_/`` excluded: those are shared recipes with a
placeholder backbone):
``Config.fromfile``, then the overrides a user would pass with ``--cfg-options``
(a tiny backbone of the same class, toy data, small images and sample counts),
then mmengine's ``Runner`` runs 2 training iterations and one evaluation with
mmseg's ``IoUMetric`` (mIoU) or mmdet's ``CocoMetric`` (bbox and segm mAP).
The recipe itself (neck, heads, optimizer constructor, schedules, pipelines'
transform types, test mode) is the config's own.

The toy images are 64 px; evaluation resizes them to sizes that are not multiples
of 16 (88 px for segmentation, cut into 72 px sliding windows; 72 px for
detection, padded to 96 by mmdet's preprocessor), so odd grids are exercised.
"""
import copy
import functools
import glob
import importlib
import math
import os.path as osp

import mmengine.config.utils
import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.datasets import toy_class_names
from tests.factories import mlla_arch

from tests.helpers.dense_heads import (two_stage_head_options, upernet_head_options,
                                        upernet_pyramid_head_options)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SEG_CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', 'upernet', '*.py')))
DET_CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', 'cascade_mask_rcnn', '*.py')))
MASK_CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', 'mask_rcnn', '*.py')))
NUM_CLASSES = 2
WIDTH = 32
DEPTH = 4
# a 4-stage MLLA (stage widths 8, 16, 32, 64), one block per stage
MLLA_ARCH = mlla_arch(embed_dims=8, num_heads=[1, 1, 2, 2])
MLLA_WIDTHS = [8, 16, 32, 64]


def config_id(path):
    return osp.splitext(osp.basename(path))[0]


@pytest.fixture(scope='module', autouse=True)
def parse_upstream_metafiles_once():
    """Resolving a ``mmseg::``/``mmdet::`` base makes mmengine parse every model-zoo
    metafile of the package (about 0.5 s) before it falls back to the ``.mim``
    path; memoise those read-only YAML loads for the 18 configs here."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mmengine.config.utils, 'load',
                      functools.lru_cache(maxsize=None)(mmengine.config.utils.load))
        yield


@pytest.fixture(scope='module', autouse=True)
def one_thread():
    """The models here are tiny: intra-op threads cost more than they save (2-3x
    the CPU time on the shared 2-core machines, measured), so use one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.lru_cache(maxsize=None)
def _load(path: str) -> Config:
    # The Runner logs and dumps the whole config several times; formatting it
    # with yapf costs seconds per run and nothing here reads it.
    return Config.fromfile(path, format_python_code=False)


def load(path: str) -> Config:
    """A fresh copy of the config, parsed once (finding upstream bases is slow)."""
    return copy.deepcopy(_load(path))


@pytest.fixture(scope='module')
def toy_root(toy_data):
    """2 classes, 2 train + 1 val image each, 64 px, ADE20K and COCO layouts."""
    return toy_data(num_classes=NUM_CLASSES, train_per_class=2, val_per_class=1,
                    size=64, formats=('ade', 'coco'))


def tiny_backbone_options(backbone: dict) -> dict:
    """A 4-block, 32-wide backbone of the config's own class (MLLA: 4 stages of one
    block, :data:`MLLA_ARCH`), without weights."""
    arch = dict(_delete_=True, embed_dims=WIDTH, num_layers=DEPTH)
    extra = {}
    if backbone['type'] == 'MLLA':
        arch = dict(_delete_=True, **MLLA_ARCH)
    elif backbone['type'] == 'DinoVim':
        # one chunk holds a whole toy sequence (at most 4 x 5 patches + 12 registers)
        extra['model.backbone.mixer_cfg'] = dict(d_state=16, headdim=16, chunk_size=32)
    elif backbone['type'] == 'LinearViT':
        arch.update(num_heads=2, mlp_ratio=2)
    elif backbone['type'] == 'mmpretrain.VisionTransformer':
        arch.update(num_heads=2, feedforward_channels=2 * WIDTH)
    else:
        raise ValueError(f'no tiny variant for backbone {backbone["type"]!r}')
    return {'model.backbone.arch': arch,
            'model.backbone.out_indices': list(range(DEPTH)),
            'model.backbone.init_cfg': None, **extra}


def shrink(scale, short: int):
    """Scale a (long, short) size, or a list of them, by one factor that makes
    the largest short side ``short``."""
    sizes = [scale] if isinstance(scale[0], (int, float)) else list(scale)
    factor = short / max(min(size) for size in sizes)
    sizes = [tuple(round(v * factor) for v in size) for size in sizes]
    return sizes[0] if isinstance(scale[0], (int, float)) else sizes


def resize_options(pipeline_key: str, pipeline: list, short: int) -> dict:
    """Shrink the ``scale`` of every Resize/RandomResize in a pipeline, and every
    size inside a RandomChoice (its resizes' ``scales``, its crops' ``crop_size``),
    by the factor that makes the largest short side of its resizes ``short``."""
    opts = {f'{pipeline_key}.{i}.scale': shrink(t['scale'], short)
            for i, t in enumerate(pipeline) if t['type'] in ('Resize', 'RandomResize')}
    for i, t in enumerate(pipeline):
        if t['type'] != 'RandomChoice':
            continue
        scales = [s for branch in t['transforms'] for step in branch
                  for s in step.get('scales', [])]
        factor = short / max(min(s) for s in scales)
        branches = []
        for branch in t['transforms']:
            branches.append([dict(step, **{key: [tuple(round(v * factor) for v in size)
                                                  for size in step[key]]
                                           if key == 'scales' else
                                           tuple(round(v * factor) for v in step[key])
                                           for key in ('scales', 'crop_size')
                                           if key in step}) for step in branch])
        opts[f'{pipeline_key}.{i}.transforms'] = branches
    return opts


def loader_options(key: str) -> dict:
    return {f'{key}.num_workers': 0, f'{key}.persistent_workers': False}


def seg_options(cfg: Config, toy_root: str) -> dict:
    data_root = osp.join(toy_root, 'ade')
    heads = upernet_pyramid_head_options(MLLA_WIDTHS, WIDTH) \
        if cfg.model.backbone.type == 'MLLA' else upernet_head_options(WIDTH)
    opts = {
        **tiny_backbone_options(cfg.model.backbone),
        **heads,
        'train_dataloader.batch_size': 2,
        'train_dataloader.dataset.data_root': data_root,
        'val_dataloader.dataset.data_root': data_root,
        'train_cfg.max_iters': 2,
        'train_cfg.val_interval': 2,
        **loader_options('train_dataloader'), **loader_options('val_dataloader'),
    }
    train_pipeline = cfg.train_dataloader.dataset.pipeline
    opts.update(resize_options('train_dataloader.dataset.pipeline', train_pipeline, 64))
    for i, t in enumerate(train_pipeline):
        if t['type'] == 'RandomCrop':
            opts[f'train_dataloader.dataset.pipeline.{i}.crop_size'] = (64, 64)
    opts.update(resize_options('val_dataloader.dataset.pipeline',
                               cfg.val_dataloader.dataset.pipeline, 88))
    return opts


def det_options(cfg: Config, toy_root: str) -> dict:
    data_root = osp.join(toy_root, 'coco') + '/'
    metainfo = dict(classes=tuple(toy_class_names(NUM_CLASSES)))
    bbox_heads = cfg.model.roi_head.bbox_head
    stages = [f'.{i}' for i in range(len(bbox_heads))] \
        if isinstance(bbox_heads, (list, tuple)) else ['']
    hierarchical = cfg.model.backbone.type == 'MLLA'
    opts = {
        **tiny_backbone_options(cfg.model.backbone),
        **two_stage_head_options(WIDTH, NUM_CLASSES, stages,
                                 MLLA_WIDTHS if hierarchical else None),
        'train_dataloader.batch_size': 2,
        'train_dataloader.dataset.data_root': data_root,
        'train_dataloader.dataset.ann_file': 'annotations/instances_train.json',
        'train_dataloader.dataset.data_prefix.img': 'train/',
        'train_dataloader.dataset.metainfo': metainfo,
        'val_dataloader.dataset.data_root': data_root,
        'val_dataloader.dataset.ann_file': 'annotations/instances_val.json',
        'val_dataloader.dataset.data_prefix.img': 'val/',
        'val_dataloader.dataset.metainfo': metainfo,
        'val_evaluator.ann_file': data_root + 'annotations/instances_val.json',
        'train_cfg.max_epochs': 1,  # 4 images, batch 2: 2 iterations
        'train_cfg.val_interval': 1,
        **loader_options('train_dataloader'), **loader_options('val_dataloader'),
    }
    opts.update(resize_options('train_dataloader.dataset.pipeline',
                               cfg.train_dataloader.dataset.pipeline, 64))
    opts.update(resize_options('val_dataloader.dataset.pipeline',
                               cfg.val_dataloader.dataset.pipeline, 72))
    return opts


def run(cfg: Config, work_dir: str) -> Runner:
    """Build the Runner from ``cfg`` and train (with its evaluation)."""
    cfg.merge_from_dict({'default_hooks.checkpoint': None,
                         'default_hooks.logger.interval': 1})
    cfg.work_dir = work_dir
    cfg.launcher = 'none'
    cfg.randomness = dict(seed=0)
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


def scalar(runner: Runner, key: str) -> float:
    hub = runner.message_hub
    assert key in hub.log_scalars, f'{key} not logged; have {sorted(hub.log_scalars)}'
    return hub.get_scalar(key).current()


def assert_trained(runner: Runner, iterations: int):
    assert runner.iter == iterations
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == iterations and all(math.isfinite(v) for v in losses)


def train_on_toy_data(path: str, options, toy_root: str, tmp_path) -> Runner:
    """The config with ``options(cfg, toy_root)`` merged, trained for its two
    iterations (finite losses) with its evaluation."""
    cfg = load(path)
    cfg.merge_from_dict(options(cfg, toy_root))
    runner = run(cfg, str(tmp_path))
    assert_trained(runner, 2)
    return runner


def train_detector_on_toy_data(path: str, toy_root: str, tmp_path) -> Runner:
    """``train_on_toy_data`` for a detection config: its CocoMetric's box and mask
    mAP in [0, 1], every parameter finite after the steps."""
    runner = train_on_toy_data(path, det_options, toy_root, tmp_path)
    for key in ('val/coco/bbox_mAP', 'val/coco/segm_mAP'):
        assert 0.0 <= scalar(runner, key) <= 1.0
    assert type(runner.val_evaluator.metrics[0]).__name__ == 'CocoMetric'
    params = [p for g in runner.optim_wrapper.optimizer.param_groups for p in g['params']]
    assert torch.isfinite(torch.cat([p.detach().flatten() for p in params])).all()
    return runner


def test_configs_load_and_follow_the_recipe():
    # 6 plain backbones, and MLLA-T/S/B (UperNet; Mask R-CNN 1x and 3x)
    assert len(SEG_CONFIGS) == 9 and len(DET_CONFIGS) == 12 and len(MASK_CONFIGS) == 6
    for path in SEG_CONFIGS + DET_CONFIGS + MASK_CONFIGS:
        cfg = load(path)
        assert cfg.model.backbone.init_cfg.type == 'Pretrained'
        assert not osp.isabs(cfg.model.backbone.init_cfg.checkpoint)
        if cfg.model.backbone.type == 'MLLA':  # the official (Swin) recipes
            assert 'constructor' not in cfg.optim_wrapper
            assert cfg.optim_wrapper.paramwise_cfg.custom_keys.norm.decay_mult == 0
            assert cfg.optim_wrapper.optimizer.lr == (6e-5 if path in SEG_CONFIGS
                                                      else 1e-4)
        else:
            assert cfg.optim_wrapper.constructor == 'LayerDecayOptimWrapperConstructor'
        for loader in (cfg.train_dataloader, cfg.val_dataloader):
            assert not osp.isabs(loader.dataset.data_root)


def test_missing_mlla_weights_name_the_download(tmp_path, monkeypatch):
    from mmdinomamba.engine import check_pretrained_checkpoints
    from mmdinomamba.engine.pretrained import MLLA_WEIGHTS
    monkeypatch.chdir(tmp_path)  # no checkpoints/ here
    for path in [p for p in SEG_CONFIGS + MASK_CONFIGS if 'mlla' in osp.basename(p)]:
        cfg = load(path)
        name = osp.basename(cfg.model.backbone.init_cfg.checkpoint)
        with pytest.raises(FileNotFoundError) as err:
            check_pretrained_checkpoints(cfg, osp.join(ROOT, 'configs'))
        assert f'wget -O checkpoints/{name} "{MLLA_WEIGHTS[name]}"' in str(err.value)


@pytest.mark.parametrize('size, dims, dpr', [('tiny', 64, (0.2, 0.1, 0.3)),
                                             ('small', 64, (0.3, 0.1, 0.3)),
                                             ('base', 96, (0.5, 0.1, 0.3))])
def test_mlla_configs_follow_the_official_settings(size, dims, dpr):
    """UperNet on the four stages (auxiliary head on the third), Mask R-CNN with a
    plain FPN over them; the drop path of the official configs; 12 / 36 epochs."""
    widths = [dims * 2 ** i for i in range(4)]
    seg = load(osp.join(ROOT, 'configs', 'upernet',
                        f'upernet_mlla-{size}_8xb2-160k_ade20k-512x512.py'))
    assert seg.model.backbone.arch == size and 'neck' not in seg.model
    assert seg.model.backbone.out_indices == (0, 1, 2, 3)
    assert seg.model.decode_head.in_channels == widths
    assert seg.model.auxiliary_head.in_channels == widths[2]
    assert seg.model.backbone.drop_path_rate == dpr[0]
    for schedule, epochs, rate in (('1x', 12, dpr[1]), ('3x', 36, dpr[2])):
        det = load(osp.join(ROOT, 'configs', 'mask_rcnn',
                            f'mask-rcnn_mlla-{size}_fpn_ms-crop-{schedule}_coco.py'))
        assert det.model.type == 'MaskRCNN' and det.model.neck.type == 'FPN'
        assert det.model.neck.in_channels == widths
        assert det.model.backbone.drop_path_rate == rate
        assert det.train_cfg.max_epochs == epochs
        assert [t['type'] for t in det.train_dataloader.dataset.pipeline][2:4] == [
            'RandomFlip', 'RandomChoice']


@pytest.mark.slow
@pytest.mark.parametrize('path', SEG_CONFIGS, ids=config_id)
def test_upernet_config_trains_and_evaluates(path, toy_root, tmp_path):
    runner = train_on_toy_data(path, seg_options, toy_root, tmp_path)
    miou = scalar(runner, 'val/mIoU')
    assert 0.0 <= miou <= 100.0
    assert type(runner.val_evaluator.metrics[0]).__name__ == 'IoUMetric'


@pytest.mark.slow
@pytest.mark.parametrize('path', DET_CONFIGS, ids=config_id)
def test_cascade_config_trains_and_evaluates(path, toy_root, tmp_path):
    runner = train_detector_on_toy_data(path, toy_root, tmp_path)
    groups = runner.optim_wrapper.optimizer.param_groups
    assert len({g['lr'] for g in groups}) == DEPTH + 2  # layer decay is in use


@pytest.mark.slow
@pytest.mark.parametrize('path', MASK_CONFIGS, ids=config_id)
def test_mask_rcnn_config_trains_and_evaluates(path, toy_root, tmp_path):
    runner = train_detector_on_toy_data(path, toy_root, tmp_path)
    assert type(runner.model).__name__ == 'MaskRCNN'
    assert type(runner.model.backbone).__name__ == 'MLLA'


def build_model(path: str, options: dict):
    """The config's model with ``options`` merged, built in the config's scope."""
    cfg = load(path)
    cfg.merge_from_dict(options)
    registry = importlib.import_module(f'{cfg.default_scope}.registry').MODELS
    with registry.switch_scope_and_registry(cfg.default_scope) as models:
        return models.build(cfg.model)


def upernet_path(backbone: str) -> str:
    return osp.join(ROOT, 'configs', 'upernet',
                    f'upernet_{backbone}-p16_8xb2-160k_ade20k-512x512.py')


def test_upernet_whole_image_of_odd_size(toy_root):
    """100 x 150 px is not a multiple of 16: the backbone floors it to 6 x 9
    patches (54 >= 13, enough for 12 registers) and the logits come back at the
    input size."""
    from mmseg.structures import SegDataSample
    path = upernet_path('dinomamba-reg-base')
    options = {**seg_options(load(path), toy_root), 'model.test_cfg.mode': 'whole'}
    model = build_model(path, options).eval()
    image = torch.randint(0, 256, (3, 100, 150), dtype=torch.uint8)
    sample = SegDataSample(metainfo=dict(img_shape=(100, 150), ori_shape=(100, 150)))
    with torch.no_grad():
        inputs = model.data_preprocessor(dict(inputs=[image], data_samples=[sample]))
        feats = model.backbone(inputs['inputs'])
        [out] = model.test_step(dict(inputs=[image], data_samples=[sample]))
    assert [tuple(f.shape) for f in feats] == [(1, WIDTH, 6, 9)] * DEPTH
    assert tuple(out.pred_sem_seg.data.shape) == (1, 100, 150)


def test_cascade_full_size_image(toy_root):
    """A 800 x 1333 image is padded to 800 x 1344 (size divisor 32): the 1/16 grid
    is exact (50 x 84 patches, position embeddings interpolated from 14 x 14), so
    the FPN levels are the padded size over their strides."""
    from mmdet.structures import DetDataSample
    path = osp.join(ROOT, 'configs', 'cascade_mask_rcnn',
                    'cascade-mask-rcnn_dinovim-base-p16_fpn_1x_coco.py')
    model = build_model(path, det_options(load(path), toy_root)).eval()
    image = torch.randint(0, 256, (3, 800, 1333), dtype=torch.uint8)
    sample = DetDataSample(metainfo=dict(img_shape=(800, 1333), ori_shape=(800, 1333),
                                         scale_factor=(1.0, 1.0)))
    with torch.no_grad():
        inputs = model.data_preprocessor(dict(inputs=[image], data_samples=[sample]))
        levels = model.extract_feat(inputs['inputs'])
        [out] = model.test_step(dict(inputs=[image], data_samples=[sample]))
    assert tuple(inputs['inputs'].shape[-2:]) == (800, 1344)
    assert [tuple(f.shape[-2:]) for f in levels] == [
        (200, 336), (100, 168), (50, 84), (25, 42), (13, 21)]
    boxes = out.pred_instances.bboxes
    assert len(boxes) > 0 and tuple(out.pred_instances.masks.shape[-2:]) == (800, 1333)
    assert (boxes[:, 2] <= 1333).all() and (boxes[:, 3] <= 800).all()


@pytest.mark.slow
def test_pretrained_backbone_loads_through_init_cfg(toy_root, tmp_path):
    """The documented flow: a plain backbone state dict (what extract_teacher.py
    writes), made at 224 px, loads into the 512 px UperNet backbone."""
    from mmdinomamba.models import DinoVim
    from mmdinomamba.models.backbones import resize_pos_embed
    mixer_cfg = dict(d_state=16, headdim=16, chunk_size=32)
    source = DinoVim(arch=dict(embed_dims=WIDTH, num_layers=DEPTH), mixer_cfg=mixer_cfg)
    checkpoint = str(tmp_path / 'backbone.pth')
    torch.save(source.state_dict(), checkpoint)
    path = upernet_path('dinovim-base')
    init_cfg = dict(type='Pretrained', checkpoint=checkpoint)
    options = {**seg_options(load(path), toy_root), 'model.backbone.init_cfg': init_cfg}
    model = build_model(path, options)
    model.init_weights()
    loaded = model.backbone.state_dict()
    expected = dict(source.state_dict())
    expected['pos_embed'] = resize_pos_embed(expected['pos_embed'], (14, 14), (32, 32),
                                             num_prefix=1)
    assert sorted(loaded) == sorted(expected)
    for name, value in expected.items():
        torch.testing.assert_close(loaded[name], value, rtol=0, atol=0, msg=name)
