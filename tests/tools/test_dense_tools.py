"""Dense prediction as users run it, through the tools, on generated data.

For one UperNet and one Cascade Mask R-CNN config (DinoVim-T), on toy data in the
ADE20K and COCO 2017 layouts pointed at by ``$DATA_ROOT``: a 2-process CPU run of
``tools/dist_train.sh`` (gloo; the SyncBN layers become BN), then
``tools/train.py --resume`` continuing it in one process, then ``tools/test.py``
on the resumed checkpoint. The models are shrunk with ``--cfg-options`` only (4
blocks, 32 channels, 64 px images, 2 iterations), as docs/dense_prediction.md
shows. Then the two "your own config" examples of docs/examples/ train for two
iterations through ``tools/train.py``, and each error a user met has its message
checked: a missing pretraining checkpoint, a vector ``out_type`` in a dense model,
an ``img_size`` smaller than a patch, and which interpreter the scripts use.
"""
import json
import os
import os.path as osp
import re
import runpy
import socket
import subprocess
import sys
from typing import Dict, List, Sequence

import pytest
import torch

from mmdinomamba.datasets import make_toy_dataset, toy_class_names

from tests.helpers.dense_heads import two_stage_head_options, upernet_head_options

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
UPERNET = osp.join(ROOT, 'configs', 'upernet',
                   'upernet_dinovim-tiny-p16_8xb2-160k_ade20k-512x512.py')
CASCADE = osp.join(ROOT, 'configs', 'cascade_mask_rcnn',
                   'cascade-mask-rcnn_dinovim-tiny-p16_fpn_1x_coco.py')
SEGFORMER = osp.join(ROOT, 'docs', 'examples',
                     'segformer_dinovim-tiny-p16_8xb2-160k_ade20k-512x512.py')
MASK_RCNN = osp.join(ROOT, 'docs', 'examples', 'mask-rcnn_dinovim-tiny-p16_fpn_1x_coco.py')
WIDTH = 32
NUM_CLASSES = 2


def cli(options: Dict[str, object]) -> List[str]:
    """``--cfg-options`` words for a dict of dotted keys (mmengine's DictAction syntax)."""
    def text(value):
        if isinstance(value, tuple):
            return '(' + ','.join(text(v) for v in value) + ')'
        if isinstance(value, list):
            return '[' + ','.join(text(v) for v in value) + ']'
        return str(value)
    return [f'{key}={text(value)}' for key, value in options.items()]


def tiny_backbone() -> Dict[str, object]:
    return {'model.backbone.arch._delete_': True,
            'model.backbone.arch.embed_dims': WIDTH,
            'model.backbone.arch.num_layers': 4,
            'model.backbone.out_indices': [0, 1, 2, 3],
            'model.backbone.init_cfg': None,
            'model.backbone.mixer_cfg.d_state': 16,
            'model.backbone.mixer_cfg.headdim': 16,
            'model.backbone.mixer_cfg.chunk_size': 32}


def loaders(**extra) -> Dict[str, object]:
    out = {}
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        out.update({f'{loader}.num_workers': 0, f'{loader}.persistent_workers': False})
    out.update({'train_dataloader.batch_size': 2, 'default_hooks.logger.interval': 1,
                'randomness.seed': 0, **extra})
    return out


def seg_options() -> Dict[str, object]:
    """UperNet at 64 px: training crops of 64, evaluation at 88 px in 72 px windows."""
    return {**tiny_backbone(),
            **upernet_head_options(WIDTH),
            'train_dataloader.dataset.pipeline.2.scale': (256, 64),
            'train_dataloader.dataset.pipeline.3.crop_size': (64, 64),
            'val_dataloader.dataset.pipeline.1.scale': (352, 88),
            'test_dataloader.dataset.pipeline.1.scale': (352, 88),
            'default_hooks.checkpoint.interval': 2,
            **loaders()}


def det_options(stages: Sequence[str] = ('.0', '.1', '.2')) -> Dict[str, object]:
    """An mmdet two-stage detector at 64 px (train) / 72 px (test) with 2 classes;
    ``stages``: the suffixes of its bbox heads (Cascade: 3, Mask R-CNN: one, '')."""
    classes = tuple(toy_class_names(NUM_CLASSES))
    return {**tiny_backbone(),
            **two_stage_head_options(WIDTH, NUM_CLASSES, stages),
            'train_dataloader.dataset.pipeline.2.scale': (107, 64),
            'val_dataloader.dataset.pipeline.1.scale': (120, 72),
            'test_dataloader.dataset.pipeline.1.scale': (120, 72),
            **{f'{loader}.dataset.metainfo.classes': classes
               for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader')},
            **loaders()}


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    """Toy data (2 classes, 2 train + 1 val image each, 64 px) in the upstream
    layouts: ADEChallengeData2016's, and COCO 2017's names (linked)."""
    root = str(tmp_path_factory.mktemp('dense_data') / 'toy')
    make_toy_dataset(root, num_classes=NUM_CLASSES, train_per_class=2, val_per_class=1,
                     size=64, formats=('ade', 'coco'))
    coco = osp.join(root, 'coco2017')
    os.makedirs(osp.join(coco, 'annotations'))
    for split in ('train', 'val'):
        os.symlink(osp.join(root, 'coco', split), osp.join(coco, f'{split}2017'))
        os.symlink(osp.join(root, 'coco', 'annotations', f'instances_{split}.json'),
                   osp.join(coco, 'annotations', f'instances_{split}2017.json'))
    return dict(ade=osp.join(root, 'ade'), coco=coco)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def run_tool(args: List[str], data_root: str, **env) -> str:
    """Run a tool as a user would (from the repository root); its output."""
    environ = dict(os.environ, DATA_ROOT=data_root, OMP_NUM_THREADS='1',
                   PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]),
                   PYTHON=sys.executable, **env)
    proc = subprocess.run(args, cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output


def train_losses(output: str) -> List[float]:
    """The ``loss`` of every ``Iter(train)`` / ``Epoch(train)`` log line."""
    return [float(v) for v in re.findall(r'\(train\).*?\s+loss: ([-\d.e+na]+)', output)]


def run_in_process(monkeypatch, tool: str, args: List[str], data_root: str) -> None:
    """``python tools/<tool> ARGS`` in this process (the imports are paid once)."""
    monkeypatch.setenv('DATA_ROOT', data_root)
    monkeypatch.setattr(sys, 'argv', [f'tools/{tool}', *args])
    runpy.run_path(osp.join(ROOT, 'tools', tool), run_name='__main__')


def user_session(monkeypatch, capsys, config: str, options: Dict[str, object],
                 data_root: str, work_dir: str, first: Dict[str, object],
                 resumed: Dict[str, object], last_ckpt: str, metrics: List[str]) -> None:
    """dist_train.sh (2 CPU processes), then train.py --resume and test.py."""
    output = run_tool(['bash', 'tools/dist_train.sh', config, '2', '--work-dir', work_dir,
                       '--cfg-options', *cli({**options, **first})], data_root,
                      PORT=str(free_port()))
    assert 'SyncBN layers -> BN' in output  # what torch's CPU DDP would refuse
    assert 'Using env variable `DATA_ROOT`' in output
    losses = train_losses(output)
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    first_ckpt = open(osp.join(work_dir, 'last_checkpoint')).read().strip()

    run_in_process(monkeypatch, 'train.py', [config, '--work-dir', work_dir, '--resume',
                                             '--cfg-options', *cli({**options, **resumed})],
                   data_root)
    output = capsys.readouterr().out
    # --resume without a path resumes from work_dir/last_checkpoint (checked first)
    assert f'Load checkpoint from {first_ckpt}' in output, output[-3000:]
    assert 'resumed epoch' in output, output[-3000:]
    assert osp.isfile(osp.join(work_dir, last_ckpt))

    out = osp.join(work_dir, 'metrics.json')
    run_in_process(monkeypatch, 'test.py', [config, osp.join(work_dir, last_ckpt),
                                            '--work-dir', osp.join(work_dir, 'test'),
                                            '--out', out, '--cfg-options', *cli(options)],
                   data_root)
    with open(out) as f:
        values = json.load(f)
    for key in metrics:
        assert key in values and 0.0 <= values[key] <= 100.0, values


@pytest.mark.slow
def test_upernet_through_the_tools(data, tmp_path, monkeypatch, capsys):
    user_session(monkeypatch, capsys, UPERNET, seg_options(), data['ade'], str(tmp_path / 'upernet'),
                 first={'train_cfg.max_iters': 2, 'train_cfg.val_interval': 2},
                 resumed={'train_cfg.max_iters': 3, 'train_cfg.val_interval': 3},
                 last_ckpt='iter_3.pth', metrics=['mIoU'])


@pytest.mark.slow
def test_cascade_through_the_tools(data, tmp_path, monkeypatch, capsys):
    user_session(monkeypatch, capsys, CASCADE, det_options(), data['coco'], str(tmp_path / 'cascade'),
                 first={'train_cfg.max_epochs': 1}, resumed={'train_cfg.max_epochs': 2},
                 last_ckpt='epoch_2.pth',
                 metrics=['coco/bbox_mAP', 'coco/segm_mAP'])


def train_in_process(monkeypatch, config: str, options: Dict[str, object],
                     work_dir: str) -> None:
    """``python tools/train.py CONFIG ...`` in this process (saves the imports)."""
    monkeypatch.setattr(sys, 'argv', ['tools/train.py', config, '--work-dir', work_dir,
                                      '--cfg-options', *cli(options)])
    runpy.run_path(osp.join(ROOT, 'tools', 'train.py'), run_name='__main__')


def upstream_data(data_root: str, loaders_: Dict[str, str]) -> Dict[str, object]:
    """Point an upstream config's dataloaders (fixed data roots) at ``data_root``."""
    out = {}
    for loader, prefix in loaders_.items():
        out[f'{loader}.dataset.data_root'] = data_root
        if prefix:
            out[f'{loader}.dataset.ann_file'] = f'annotations/instances_{prefix}.json'
            out[f'{loader}.dataset.data_prefix.img'] = f'{prefix}/'
    return out


@pytest.mark.slow
def test_segformer_example_trains(data, tmp_path, monkeypatch):
    """mmseg's SegFormer-B0 recipe with DinoVim-T (docs/examples/)."""
    options = {**tiny_backbone(),
               'model.neck.embed_dim': WIDTH,
               'model.decode_head.in_channels': [WIDTH] * 4,
               'model.decode_head.channels': WIDTH,
               'model.data_preprocessor.size': (64, 64),
               'train_dataloader.dataset.pipeline.2.scale': (256, 64),
               'train_dataloader.dataset.pipeline.3.crop_size': (64, 64),
               'val_dataloader.dataset.pipeline.1.scale': (352, 88),
               'train_cfg.max_iters': 2, 'train_cfg.val_interval': 2,
               'default_hooks.checkpoint': None,
               **upstream_data(data['ade'], dict(train_dataloader='', val_dataloader='')),
               **loaders()}
    from mmengine.runner import Runner
    runs = []
    monkeypatch.setattr(Runner, 'train', _record(Runner.train, runs))
    train_in_process(monkeypatch, SEGFORMER, options, str(tmp_path))
    [runner] = runs
    assert type(runner.model.decode_head).__name__ == 'SegformerHead'
    assert type(runner.model.backbone).__name__ == 'DinoVim'
    assert runner.iter == 2 and 'val/mIoU' in runner.message_hub.log_scalars
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.slow
def test_mask_rcnn_example_trains(data, tmp_path, monkeypatch):
    """mmdet's Mask R-CNN R-50 1x recipe with DinoVim-T (docs/examples/)."""
    coco = data['coco']
    options = {**det_options(stages=['']),
               'val_evaluator.ann_file': f'{coco}/annotations/instances_val2017.json',
               'train_cfg.max_epochs': 1, 'default_hooks.checkpoint': None,
               **upstream_data(coco + '/', dict(train_dataloader='train2017',
                                                val_dataloader='val2017',
                                                test_dataloader='val2017'))}
    from mmengine.runner import Runner
    runs = []
    monkeypatch.setattr(Runner, 'train', _record(Runner.train, runs))
    train_in_process(monkeypatch, MASK_RCNN, options, str(tmp_path))
    [runner] = runs
    assert type(runner.model).__name__ == 'MaskRCNN'
    assert runner.iter == 2 and 'val/coco/segm_mAP' in runner.message_hub.log_scalars
    groups = runner.optim_wrapper.optimizer.param_groups
    assert groups[0]['lr_scale'] == 1.0 and len({g['lr'] for g in groups}) == 4 + 2


def _record(train, runs):
    """Runner.train that also keeps the runner, to look at it afterwards."""
    def wrapped(self):
        runs.append(self)
        return train(self)
    return wrapped


@pytest.mark.parametrize('config, root, ann', [
    (UPERNET, '/data/ADEChallengeData2016', False),
    (CASCADE, '/data/coco', True),
    (CASCADE.replace('_1x_', '_ms-3x_'), '/data/coco/', True),
], ids=['upernet', 'cascade-1x', 'cascade-ms-3x'])
def test_data_root_reaches_train_val_and_test(config, root, ann, monkeypatch):
    """One variable moves every loader (and COCO's evaluators); the issue's
    overrides missed test_dataloader / test_evaluator."""
    from mmengine.config import Config
    monkeypatch.setenv('DATA_ROOT', root)
    cfg = Config.fromfile(config)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        assert cfg[loader].dataset.data_root.rstrip('/') == root.rstrip('/'), loader
    if ann:
        for evaluator in ('val_evaluator', 'test_evaluator'):
            assert cfg[evaluator].ann_file == \
                '/data/coco/annotations/instances_val2017.json', evaluator


# ------------------------------------------------------------ the errors users met
def test_missing_pretraining_checkpoint_names_the_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no checkpoints/ here
    options = {k: v for k, v in seg_options().items() if k != 'model.backbone.init_cfg'}
    with pytest.raises(FileNotFoundError) as err:
        train_in_process(monkeypatch, UPERNET, options, str(tmp_path / 'work'))
    message = str(err.value)
    for part in ["'checkpoints/dinovim-tiny-p16_dino-in1k.pth'",
                 'model.backbone.init_cfg.checkpoint',
                 'bash tools/dist_train.sh '
                 'configs/dino/dino_dinovim-tiny-p16_4xb48-amp-100e_in1k.py',
                 'python tools/model_converters/extract_teacher.py work_dirs/'
                 'dino_dinovim-tiny-p16_4xb48-amp-100e_in1k/epoch_100.pth',
                 'tools/model_converters/dinomamba2mmdinomamba.py',
                 '--cfg-options model.backbone.init_cfg=None']:
        assert part in message, message
    assert not (tmp_path / 'work').exists()  # stopped before the Runner


def test_missing_training_checkpoint_names_its_config(tmp_path, monkeypatch):
    """A linear probe reads a DINO run's checkpoint: the message names that run."""
    from mmengine.config import Config

    from mmdinomamba.engine import check_pretrained_checkpoints
    monkeypatch.chdir(tmp_path)
    cfg = Config.fromfile(osp.join(ROOT, 'configs', 'linear_probe',
                                   'dinovim-toy-p8_1xb16-linear-10e_toy.py'))
    with pytest.raises(FileNotFoundError, match=re.escape(
            'python tools/train.py configs/dino/dino_dinovim-toy-p8_1xb8-10e_toy.py')):
        check_pretrained_checkpoints(cfg, osp.join(ROOT, 'configs'))
    (tmp_path / 'work_dirs' / 'dino_dinovim-toy-p8_1xb8-10e_toy').mkdir(parents=True)
    (tmp_path / 'work_dirs' / 'dino_dinovim-toy-p8_1xb8-10e_toy' / 'epoch_10.pth').touch()
    check_pretrained_checkpoints(cfg, osp.join(ROOT, 'configs'))  # present: no error


@pytest.mark.parametrize('config, scope', [(SEGFORMER, 'mmseg'), (MASK_RCNN, 'mmdet')],
                         ids=['mmseg', 'mmdet'])
def test_vector_out_type_in_a_dense_model(config, scope):
    """The issue's naive config: DinoVim's default out_type='cls_token'."""
    import importlib

    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    cfg = Config.fromfile(config)
    # the examples' widths (256) with 4 blocks
    cfg.merge_from_dict({**tiny_backbone(), 'model.backbone.arch.embed_dims': 256,
                         'model.backbone.out_type': 'cls_token'})
    models = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        model = models.build(cfg.model)
        with pytest.raises(ValueError, match=r"out_type='cls_token'.*out_type='featmap'"):
            model.extract_feat(torch.zeros(1, 3, 64, 64))
        model.backbone.out_type = 'featmap'  # the fix
        assert len(model.extract_feat(torch.zeros(1, 3, 64, 64))) >= 4


def test_img_size_smaller_than_a_patch():
    from mmdinomamba.models import DinoVim, LinearViT
    with pytest.raises(ValueError, match=r'img_size \(8, 8\) is smaller than patch_size 16'):
        DinoVim(arch=dict(embed_dims=32, num_layers=1), img_size=8)
    with pytest.raises(ValueError, match=r'img_size \(64, 12\) is smaller'):
        LinearViT(arch=dict(embed_dims=32, num_layers=1, num_heads=2, mlp_ratio=2),
                  img_size=(64, 12))
    assert DinoVim(arch=dict(embed_dims=32, num_layers=1), img_size=16,
                   mixer_cfg=dict(d_state=16, headdim=16)).patch_resolution == (1, 1)


@pytest.mark.parametrize('script, args', [
    ('dist_train.sh', ['cfg.py', '2', '--resume']),
    ('dist_test.sh', ['cfg.py', 'ckpt.pth', '2']),
])
@pytest.mark.slow
def test_scripts_use_the_venv_interpreter(tmp_path, script, args):
    """From a fresh clone after ``make install``: .venv/bin/python, not PATH's."""
    repo = tmp_path / 'clone'
    (repo / 'tools').mkdir(parents=True)
    for name in (script, '_launch_common.sh'):  # the launcher and the helper it sources
        (repo / 'tools' / name).write_text(open(osp.join(ROOT, 'tools', name)).read())
    for name in ('.venv/bin/python', 'other/python'):
        fake = repo / name
        fake.parent.mkdir(parents=True)
        fake.write_text(f'#!/bin/sh\necho "{name} $@" > "{repo}/called"\n')
        fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHON'}
    env['PATH'] = '/usr/bin:/bin'  # no python of ours on it
    subprocess.run(['bash', str(repo / 'tools' / script), *args], env=env, check=True)
    called = (repo / 'called').read_text()
    assert called.startswith('.venv/bin/python -m torch.distributed.run'), called
    assert '--nproc_per_node=2' in called and '--launcher pytorch' in called
    env['PYTHON'] = str(repo / 'other' / 'python')
    subprocess.run(['bash', str(repo / 'tools' / script), *args], env=env, check=True)
    assert (repo / 'called').read_text().startswith('other/python -m'), called
