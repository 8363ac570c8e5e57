"""DINO end to end on toy data: resume, DDP (gloo), frozen last layer."""
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmpretrain.registry import MODELS

import mmdinomamba  # noqa: F401  (registers our classes)
from mmdinomamba.utils import allow_mmengine_checkpoint_types

from tests.helpers.toy_training import ROOT, StopAfter, tiny_dino_config
from tests.helpers.toy_training import train as run


class RecordLastLayer(Hook):
    """Snapshot the student head before training and after each epoch."""

    def __init__(self):
        self.snapshots = []

    def _snap(self, runner):
        head = runner.model.head
        self.snapshots.append({k: v.detach().clone() for k, v in head.state_dict().items()})

    def before_train(self, runner):
        self._snap(runner)

    def after_train_epoch(self, runner):
        self._snap(runner)


def load(path):
    # weights_only=True (torch's default): must work with the allow-list alone
    return torch.load(path, map_location='cpu', weights_only=True)


@pytest.fixture(scope='module')
def dino_runs(toy_root, tmp_path_factory):
    """2 epochs uninterrupted; 1 epoch (of a 2-epoch schedule); its resumption."""
    allow_mmengine_checkpoint_types()
    tmp = tmp_path_factory.mktemp('dino_runs')
    full = run(tiny_dino_config(toy_root, str(tmp / 'full')), 'dino-full')
    record = RecordLastLayer()
    run(tiny_dino_config(toy_root, str(tmp / 'half')), 'dino-half',
        hooks=[StopAfter(1), record])
    first = str(tmp / 'half' / 'epoch_1.pth')
    resumed = run(tiny_dino_config(toy_root, str(tmp / 'resumed')), 'dino-resumed',
                  resume_from=first)
    return dict(tmp=tmp, full_iter=full.iter, resumed_iter=resumed.iter,
                snapshots=record.snapshots, toy_root=toy_root)


@pytest.mark.slow
def test_resume_matches_uninterrupted_run(dino_runs):
    tmp = dino_runs['tmp']
    assert dino_runs['full_iter'] == dino_runs['resumed_iter'] == 8
    assert not osp.exists(tmp / 'half' / 'epoch_2.pth')
    want, got = load(tmp / 'full' / 'epoch_2.pth'), load(tmp / 'resumed' / 'epoch_2.pth')
    assert set(want['state_dict']) == set(got['state_dict'])
    assert any(k.startswith('teacher.') for k in want['state_dict'])
    assert 'loss_module.center' in want['state_dict']
    for key, value in want['state_dict'].items():
        # same float32 operations in the same order on the CPU: bitwise equal
        assert torch.equal(value, got['state_dict'][key]), key
    opt_want, opt_got = want['optimizer']['state'], got['optimizer']['state']
    assert opt_want.keys() == opt_got.keys() and len(opt_want) > 0
    for idx, state in opt_want.items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt_got[idx][name]))
    groups = [(g['lr'], g['weight_decay']) for g in want['optimizer']['param_groups']]
    assert groups == [(g['lr'], g['weight_decay'])
                      for g in got['optimizer']['param_groups']]


@pytest.mark.slow
def test_compile_hook_compiles_both_backbones_and_trains_the_same(dino_runs):
    """CompileModulesHook as a config selects it: both backbones compiled in place,
    checkpoints with the eager run's keys and, with Dynamo's graphs run by the
    'eager' backend, the eager run's weights bit for bit (that the compiler's own
    backends compute the same function is tests/models/test_compile.py's job)."""
    torch._dynamo.reset()
    tmp = dino_runs['tmp']
    cfg = tiny_dino_config(dino_runs['toy_root'], str(tmp / 'compiled'))
    cfg.custom_hooks.append(dict(type='CompileModulesHook',
                                 modules=['backbone', 'teacher.backbone'],
                                 backend='eager', dynamic=False))
    runner = run(cfg, 'dino-compiled')
    model = runner.model
    for module in (model.backbone, model.teacher['backbone']):
        assert module._compiled_call_impl is not None
    assert model.head._compiled_call_impl is None
    want, got = load(tmp / 'full' / 'epoch_2.pth'), load(tmp / 'compiled' / 'epoch_2.pth')
    assert set(want['state_dict']) == set(got['state_dict'])
    for key, value in want['state_dict'].items():
        assert torch.equal(got['state_dict'][key], value), key


def test_compile_hook_names_a_missing_module():
    from mmdinomamba.engine import CompileModulesHook
    hook = CompileModulesHook(modules=['backbone', 'teacher.neck'])

    class FakeRunner:
        model = torch.nn.ModuleDict(dict(backbone=torch.nn.Linear(2, 2),
                                         teacher=torch.nn.ModuleDict()))
    with pytest.raises(AttributeError, match="no submodule 'teacher.neck'.*backbone"):
        hook.before_train(FakeRunner())
    assert FakeRunner.model['backbone']._compiled_call_impl is None  # nothing half-done
    with pytest.raises(ValueError, match='names no submodule'):
        CompileModulesHook(modules=[])


@pytest.mark.slow
def test_last_layer_frozen_during_first_epoch(dino_runs):
    before, after_epoch1 = dino_runs['snapshots'][:2]
    for key in before:
        changed = not torch.equal(before[key], after_epoch1[key])
        assert changed == (not key.startswith('last_layer')), key
    # and it trains afterwards: epoch 2 of the uninterrupted run moved it
    final = load(dino_runs['tmp'] / 'full' / 'epoch_2.pth')['state_dict']
    key = 'last_layer.parametrizations.weight.original1'
    assert not torch.equal(final['head.' + key], before[key])


@pytest.mark.slow
def test_linear_probe_and_extractor_load_the_teacher(dino_runs, tmp_path, load_tool):
    ckpt = str(dino_runs['tmp'] / 'full' / 'epoch_2.pth')
    teacher = {k[len('teacher.backbone.'):]: v for k, v in load(ckpt)['state_dict'].items()
               if k.startswith('teacher.backbone.')}
    out = str(tmp_path / 'teacher.pth')
    load_tool('tools/model_converters/extract_teacher.py').main([ckpt, out])
    extracted = load(out)
    assert extracted['meta']['epoch'] == 2 and extracted['meta']['branch'] == 'teacher'
    assert extracted['state_dict'].keys() == teacher.keys()
    assert all(torch.equal(v, teacher[k]) for k, v in extracted['state_dict'].items())

    # the toy probe config, shrunk like the toy run, loads the teacher by default
    cfg = Config.fromfile(osp.join(ROOT, 'configs/linear_probe/'
                                   'dinovim-toy-p8_1xb16-linear-10e_toy.py'))
    cfg.model.backbone.update(arch=dict(embed_dims=32, num_layers=2), img_size=32,
                              frozen_stages=2)
    cfg.model.backbone.init_cfg.checkpoint = ckpt
    cfg.model.neck.in_channels = cfg.model.head.in_channels = 64
    for init_cfg in (cfg.model.backbone.init_cfg,
                     dict(type='Pretrained', checkpoint=out)):
        cfg.model.backbone.init_cfg = init_cfg
        model = MODELS.build(cfg.model)
        model.init_weights()
        loaded = model.backbone.state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in teacher.items())


@pytest.mark.slow
def test_two_process_ddp_gloo_keeps_one_centre(toy_root, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
               OMP_NUM_THREADS='1')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
           '--master_port=29531', '-m', 'tests.helpers.dino_ddp_worker', toy_root,
           str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    states = [load(tmp_path / f'state_rank{r}.pth') for r in (0, 1)]
    assert [s['world_size'] for s in states] == [2, 2]
    assert states[0]['iter'] == 2  # 16 images / 2 processes / 4 per batch
    assert states[0]['center'].abs().sum() > 0
    assert torch.equal(states[0]['center'], states[1]['center'])
    for key, value in states[0]['teacher'].items():
        assert torch.equal(value, states[1]['teacher'][key]), key
