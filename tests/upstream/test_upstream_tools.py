"""Upstream tools and loaders on our configs and on a checkpoint of our
``tools/train.py``, as users run them: mmpretrain's scripts (shipped in its
package under ``.mim/tools``, not importable) from a temporary copy, in a fresh
process from another folder; each imports mmdinomamba only through the config's
``custom_imports``, and loads checkpoints with torch's default
``weights_only=True``."""
import glob
import os
import os.path as osp
import re
import shutil
import subprocess
import sys

import mmpretrain
import pytest
import torch
from mmengine.analysis import get_model_complexity_info

from mmdinomamba import zoo
from mmdinomamba.datasets import make_toy_dataset
from mmdinomamba.models.backbones import DinoVim

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
UPSTREAM_TOOLS = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools')
PROBE = zoo.config_path('linear_probe', 'dinovim-toy-p8_1xb16-linear-10e_toy.py')
DINO = zoo.config_path('dino', 'dino_dinovim-toy-p8_1xb8-10e_toy.py')
ENV = dict(os.environ, OMP_NUM_THREADS='1',
           PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))


def run(args, cwd):
    """Run a command in ``cwd``; its output (it must succeed)."""
    proc = subprocess.run(args, cwd=str(cwd), env=ENV, capture_output=True, text=True,
                          timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output


def upstream(tool: str, tmp_path) -> str:
    """A temporary copy of mmpretrain's ``tools/<tool>``."""
    copy = tmp_path / osp.basename(tool)
    shutil.copy(osp.join(UPSTREAM_TOOLS, tool), copy)
    return str(copy)


def data_options(root: str, loaders=('train', 'val', 'test')):
    return [f'{loader}_dataloader.{key}' for loader in loaders for key in (
        f'dataset.data_root={root}', f'dataset.classes={root}/classes.txt',
        'num_workers=0', 'persistent_workers=False')]


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """The toy linear probe (random frozen backbone) trained one epoch by
    ``tools/train.py`` on generated data: (data root, work dir, checkpoint)."""
    tmp = tmp_path_factory.mktemp('upstream')
    root = str(tmp / 'toy')
    make_toy_dataset(root, num_classes=4, train_per_class=4, val_per_class=2, size=64,
                     formats=['imagenet'])
    work = tmp / 'work'
    run([sys.executable, osp.join(REPO, 'tools', 'train.py'), PROBE, '--work-dir',
         str(work), '--cfg-options', 'model.backbone.init_cfg=None',
         'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
         'param_scheduler.0.T_max=1', 'param_scheduler.0.end=1',
         'train_dataloader.batch_size=4', 'default_hooks.logger.interval=1',
         'default_hooks.checkpoint.interval=1', *data_options(root)], cwd=tmp)
    return root, work, str(work / 'epoch_1.pth')


LOADERS = """
import sys
import numpy as np, torch
import mmdinomamba, mmpretrain
config, ckpt, image = sys.argv[1:]
saved = torch.load(ckpt)['state_dict']  # torch's default: weights_only=True
model = mmpretrain.get_model(config, pretrained=ckpt, backbone=dict(init_cfg=None))
assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
inferencer = mmpretrain.ImageClassificationInferencer(
    config, pretrained=ckpt, device='cpu', backbone=dict(init_cfg=None))
assert all(torch.equal(v, saved[k]) for k, v in inferencer.model.state_dict().items())
result, = inferencer(image)
print('CLASS', result['pred_class'], round(float(np.sum(result['pred_scores'])), 4))
"""


@pytest.mark.slow
def test_train_checkpoint_loads_in_get_model_and_the_inferencer(trained, tmp_path):
    """A fresh process that imports only mmdinomamba and mmpretrain reads the
    checkpoint of tools/train.py with ``mmpretrain.get_model(cfg, pretrained=)``
    and ``ImageClassificationInferencer`` (the config as a file, ``weights_only``
    as torch has it), every tensor as saved."""
    root, _, ckpt = trained
    image = sorted(glob.glob(osp.join(root, 'val', '*', '*')))[0]
    out = run([sys.executable, '-c', LOADERS, PROBE, ckpt, image], cwd=tmp_path)
    classes = open(osp.join(root, 'classes.txt')).read().split()
    # (the inferencer's progress bar ends without a new line)
    name, total = re.search(r'CLASS (\S+) (\S+)', out).groups()
    # the class names come from the checkpoint's dataset meta
    assert name in classes and total == '1.0'


@pytest.mark.slow
def test_confusion_matrix(trained, tmp_path):
    root, _, ckpt = trained
    out = run([sys.executable, upstream('analysis_tools/confusion_matrix.py', tmp_path),
               PROBE, ckpt, '--show-path', 'cm.png', '--include-values',
               '--cfg-options', *data_options(root, ('test', ))], cwd=tmp_path)
    assert 'The confusion matrix is saved at cm.png' in out
    assert (tmp_path / 'cm.png').stat().st_size > 0


@pytest.mark.slow
def test_analyze_logs(trained, tmp_path):
    _, work, _ = trained
    # mmengine's json log, <timestamp>.json beside scalars.json
    log, = [p for p in glob.glob(str(work / '*' / 'vis_data' / '*.json'))
            if osp.basename(p) != 'scalars.json']
    tool = upstream('analysis_tools/analyze_logs.py', tmp_path)
    out = run([sys.executable, tool, 'cal_train_time', log], cwd=tmp_path)
    assert 'average iter time' in out
    run([sys.executable, tool, 'plot_curve', log, '--keys', 'loss', '--out',
         'loss.png'], cwd=tmp_path)
    assert (tmp_path / 'loss.png').stat().st_size > 0


@pytest.mark.slow
def test_print_config(tmp_path):
    out = run([sys.executable, upstream('misc/print_config.py', tmp_path), DINO],
              cwd=tmp_path)
    assert "type='DinoVim'" in out and "type='CPUThreadsHook'" in out


@pytest.mark.slow
def test_browse_dataset_on_the_multi_crop_config(tmp_path):
    """The DINO multi-crop pipeline through mmpretrain's browse_dataset.py (its
    visualizer was built with mmengine's ``_scope_`` key: a TypeError). Its other
    modes draw a grid through a private matplotlib call that matplotlib 3.11
    changed (an upstream defect, docs/get_started.md); ``original`` shows what
    the pipeline reads."""
    root = str(tmp_path / 'toy')
    make_toy_dataset(root, num_classes=2, train_per_class=2, val_per_class=1, size=64,
                     formats=['imagenet'])
    run([sys.executable, upstream('visualization/browse_dataset.py', tmp_path), DINO,
         '--not-show', '--output-dir', 'shown', '--show-number', '3', '--mode',
         'original', '--cfg-options', f'train_dataloader.dataset.data_root={root}'],
        cwd=tmp_path)
    assert len(os.listdir(tmp_path / 'shown')) == 3


@pytest.mark.slow
def test_get_flops_on_a_dinovim_config(tmp_path):
    """mmpretrain's get_flops.py (mmengine's traced counter) on the toy DinoVim
    linear probe at its 64 px: the parameters of the built model."""
    out = run([sys.executable, upstream('analysis_tools/get_flops.py', tmp_path), PROBE,
               '--shape', '64'], cwd=tmp_path)
    model = mmpretrain.get_model(PROBE)
    params = sum(p.numel() for p in model.parameters())
    assert f'Params: {params / 1e6:.3f}M' in out and 'Flops: ' in out


def test_mmengine_complexity_counter_traces_dinovim():
    """mmengine's counter traces the model (``torch.jit.trace``), where a tensor's
    size is a tensor: the automatic SSD chunk of DinoVim's mixer is an int all the
    same (it was ``ssd: chunk_size must be a positive int, got tensor(66)``)."""
    model = DinoVim(arch=dict(embed_dims=32, num_layers=2), img_size=64, patch_size=8,
                    mixer_cfg=dict(d_state=16, headdim=16)).eval()
    result = get_model_complexity_info(model, input_shape=(3, 64, 64))
    assert result['params'] == sum(p.numel() for p in model.parameters())
    # at least the two in_proj / out_proj products of each block, per token
    tokens = 64 + 2
    in_proj = model.layers[0].mixer.in_proj
    out_proj = model.layers[0].mixer.out_proj
    per_block = tokens * (in_proj.in_features * in_proj.out_features
                          + out_proj.in_features * out_proj.out_features)
    assert result['flops'] >= 2 * per_block
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 64, 64))[0]).all()


# -- mmdet's and mmseg's get_flops on the dense configs ------------------------------

MMDET_TOOLS = osp.join(osp.dirname(__import__('mmdet').__file__), '.mim', 'tools')
MMSEG_TOOLS = osp.join(osp.dirname(__import__('mmseg').__file__), '.mim', 'tools')
MMDET_CONFIGS = osp.join(osp.dirname(MMDET_TOOLS), 'configs')
MMSEG_CONFIGS = osp.join(osp.dirname(MMSEG_TOOLS), 'configs')


def test_the_traced_counter_resizes_the_position_table():
    """As found: under tracing (mmengine's counter, mmdet's get_flops) a grid read
    from a tensor's shape is a tensor, and resizing the position table to an input
    of another size than ``img_size`` failed (``upsample_bicubic2d() received an
    invalid combination of arguments - got (Tensor, NoneType, ...``). The traced
    model now gives what the eager one gives, and the counter counts it."""
    model = DinoVim(arch=dict(embed_dims=32, num_layers=2), img_size=64, patch_size=8,
                    mixer_cfg=dict(d_state=16, headdim=16), out_type='featmap').eval()
    image = torch.randn(1, 3, 96, 80)
    with torch.no_grad():
        eager = model(image)[0]
        traced = torch.jit.trace(model, image, check_trace=False)(image)[0]
    torch.testing.assert_close(traced, eager)
    result = get_model_complexity_info(model, inputs=(image, ))
    assert result['params'] == sum(p.numel() for p in model.parameters())
    assert result['flops'] > 0


def coco_2017(root: str) -> str:
    """The toy COCO data under COCO 2017's names (linked); its folder."""
    coco = osp.join(root, 'coco2017')
    os.makedirs(osp.join(coco, 'annotations'))
    for split in ('train', 'val'):
        os.symlink(osp.join(root, 'coco', split), osp.join(coco, f'{split}2017'))
        os.symlink(osp.join(root, 'coco', 'annotations', f'instances_{split}.json'),
                   osp.join(coco, 'annotations', f'instances_{split}2017.json'))
    return coco


@pytest.mark.slow
@pytest.mark.parametrize('config', [
    zoo.config_path('cascade_mask_rcnn', 'cascade-mask-rcnn_dinovim-tiny-p16_fpn_1x_coco.py'),
    zoo.config_path('mask_rcnn', 'mask-rcnn_mlla-tiny_fpn_ms-crop-1x_coco.py'),
    osp.join(MMDET_CONFIGS, 'mask_rcnn', 'mask-rcnn_r50_fpn_1x_coco.py'),
], ids=['cascade-dinovim-t', 'mask-rcnn-mlla-t', 'mmdet-mask-rcnn-r50'])
def test_mmdet_get_flops_on_the_detectors(tmp_path, config):
    """mmdet's tools/analysis_tools/get_flops.py (one image of the validation data,
    resized to at most 120 x 72, traced through the detector) on ours as on
    mmdet's own Mask R-CNN; the DinoVim detectors failed in resize_pos_embed."""
    make_toy_dataset(str(tmp_path / 'toy'), num_classes=2, train_per_class=1,
                     val_per_class=1, size=64, formats=['coco'])
    coco = coco_2017(str(tmp_path / 'toy'))
    copy = tmp_path / 'get_flops.py'
    shutil.copy(osp.join(MMDET_TOOLS, 'analysis_tools', 'get_flops.py'), copy)
    env = dict(ENV, DATA_ROOT=coco)
    proc = subprocess.run(
        [sys.executable, str(copy), config, '--num-images', '1', '--cfg-options',
         'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False',
         'val_dataloader.dataset.pipeline.1.scale=(120,72)',
         f'val_dataloader.dataset.data_root={coco}/'],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r'Flops: [0-9.]+[GMT]', out) and 'Params: ' in out


@pytest.mark.slow
def test_mmseg_get_flops_logic_on_upernet():
    """mmseg's get_flops.py counts with mmengine's counter on the segmentor's tensor
    forward of a preprocessed random image: that logic, on our UperNet (DinoVim-T,
    the table resized from 512 to 128 px under tracing) as on mmseg's SegFormer."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample
    for config in (zoo.config_path('upernet', 'upernet_dinovim-tiny-p16_8xb2-160k_'
                                   'ade20k-512x512.py'),
                   osp.join(MMSEG_CONFIGS, 'segformer',
                            'segformer_mit-b0_8xb2-160k_ade20k-512x512.py')):
        cfg = Config.fromfile(config)
        init_default_scope('mmseg')
        model = MODELS.build(cfg.model)
        model.auxiliary_head = None
        meta = dict(ori_shape=(128, 128), pad_shape=(128, 128))
        data = model.data_preprocessor(dict(inputs=[torch.rand(3, 128, 128)],
                                            data_samples=[SegDataSample(metainfo=meta)]))
        model.eval()
        result = get_model_complexity_info(model, inputs=data['inputs'],
                                           show_table=False, show_arch=False)
        assert result['flops'] > 0, config
        assert result['params'] == sum(p.numel() for p in model.parameters()), config


@pytest.mark.slow
def test_mmseg_get_flops_script_fails_on_its_own_configs_too(tmp_path):
    """mmseg 1.2.2's get_flops.py passes both ``input_shape`` and ``inputs`` to
    mmengine's counter, which refuses that (mmengine 0.10): it fails on mmseg's own
    configs as on ours, before any model code runs. docs/get_started.md says so and
    points at tools/analysis/get_flops.py, which counts our UperNet."""
    copy = tmp_path / 'get_flops.py'
    shutil.copy(osp.join(MMSEG_TOOLS, 'analysis_tools', 'get_flops.py'), copy)
    upernet = zoo.config_path('upernet', 'upernet_dinovim-tiny-p16_8xb2-160k_ade20k-'
                              '512x512.py')
    for config in (osp.join(MMSEG_CONFIGS, 'segformer',
                            'segformer_mit-b0_8xb2-160k_ade20k-512x512.py'), upernet):
        proc = subprocess.run([sys.executable, str(copy), config, '--shape', '64'],
                              cwd=str(tmp_path), env=ENV, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 1
        assert '"input_shape" and "inputs" cannot be both set.' in proc.stderr
    out = run([sys.executable, osp.join(REPO, 'tools', 'analysis', 'get_flops.py'),
               upernet, '--shape', '64', '64'], cwd=tmp_path)
    assert re.search(r'MACs: +[0-9,]+', out) and 'backbone' in out
    with open(osp.join(REPO, 'docs', 'get_started.md')) as f:
        docs = f.read()
    assert 'cannot be both set' in docs
