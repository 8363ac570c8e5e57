"""tools/train.py and tools/run_comparison.py fail before anything is written, with
a named cause, on what used to fail late or raw:

- ``--amp`` (or an ``-amp`` config) without a GPU: was mmengine's raw
  ``AmpOptimizerWrapper is only available training on gpu...`` assertion, after
  the work dir and its log were written;
- ``run_comparison.py --device cuda`` without CUDA: was 61 MB of data and four
  trainings started, then the same assertion after 3 minutes;
- ``train_cfg.max_epochs=0`` / ``1``: was mmengine's "end should be larger than
  begin";
- ``lr=abc``: was ``TypeError: '<=' not supported between instances of 'float'
  and 'str'``.
"""
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from mmdinomamba import zoo

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOY_DINO = zoo.config_path('dino', 'dino_dinovim-toy-p8_1xb8-10e_toy.py')
TOY_PROBE = zoo.config_path('linear_probe', 'dinovim-toy-p8_1xb16-linear-10e_toy.py')


def main_of(load_tool, monkeypatch, *argv):
    """tools/train.py's main with ``argv``, in this process, on a machine without
    CUDA."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(sys, 'argv', ['tools/train.py', *argv])
    return load_tool('tools/train.py').main


@pytest.mark.parametrize('config,argv,match', [
    (TOY_PROBE, ['--amp'], r"--amp trains in mixed precision, which needs a GPU, and "
     r'this machine has none .*: train in float32 on the CPU with --cfg-options '
     r'optim_wrapper\.type=OptimWrapper and without --amp'),
    # the comparison's DINO configs are AMP recipes
    (zoo.config_path('compare', 'dino_vit-d192-l12-p8_1xb128-20e_toy-rich.py'), [],
     r"the config's optim_wrapper\.type='PerParamClipAmpOptimWrapper' trains in mixed "
     r'precision.*--cfg-options optim_wrapper\.type=PerParamClipOptimWrapper$'),
])
def test_mixed_precision_without_a_gpu_fails_before_the_work_dir(
        load_tool, monkeypatch, tmp_path, config, argv, match):
    work = tmp_path / 'work'
    main = main_of(load_tool, monkeypatch, config, '--work-dir', str(work), *argv)
    with pytest.raises(RuntimeError, match=match):
        main()
    assert not work.exists()


@pytest.mark.parametrize('option,match', [
    ('optim_wrapper.optimizer.lr=abc',
     r"optim_wrapper\.optimizer\.lr must be number \(float\) or Tensor, got 'abc' "
     r'\(str\)'),
    ('optim_wrapper.optimizer.weight_decay=[1,2]',
     r'optim_wrapper\.optimizer\.weight_decay must be number \(float\), got \[1, 2\] '
     r'\(list\)'),
    ('model.backbone.drop_path_rate=high',
     r"model\.backbone\.drop_path_rate must be number \(float\), got 'high' \(str\)"),
    ('train_cfg.max_epochs=0', r'train_cfg\.max_epochs must be a whole number >= 1'),
])
def test_a_wrong_value_is_named_before_the_work_dir(load_tool, monkeypatch, tmp_path,
                                                    option, match):
    work = tmp_path / 'work'
    main = main_of(load_tool, monkeypatch, TOY_DINO, '--work-dir', str(work),
                   '--cfg-options', option)
    with pytest.raises(ValueError, match=match):
        main()
    assert not work.exists()


def test_run_comparison_on_cuda_without_cuda_exits_at_once(load_tool, monkeypatch,
                                                           tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    script = load_tool('tools/run_comparison.py')
    work, data = tmp_path / 'cmp', tmp_path / 'data'
    with pytest.raises(SystemExit) as exit_:
        script.main(['--work-dir', str(work), '--data-root', str(data),
                     '--device', 'cuda'])
    assert exit_.value.code == 2
    assert ('--device cuda: this machine has no CUDA device (torch.cuda.is_available() '
            'is False); run with --device cpu') in capsys.readouterr().err
    assert not work.exists() and not data.exists()


def run_train(args, cwd, env=None):
    env = dict(os.environ, OMP_NUM_THREADS='1', CUDA_VISIBLE_DEVICES='',
               PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
               **(env or {}))
    return subprocess.run([sys.executable, osp.join(ROOT, 'tools/train.py'), *args],
                          cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_the_cli_exit_codes_of_the_start_checks(tmp_path):
    """As a process, on a machine with its GPUs hidden: exit 1, the named cause
    on stderr, no work dir."""
    work = tmp_path / 'work'
    for args, message in [
            (['--amp'], '--amp trains in mixed precision, which needs a GPU'),
            (['--cfg-options', 'train_cfg.max_epochs=0'],
             'train_cfg.max_epochs must be a whole number >= 1'),
            (['--cfg-options', 'optim_wrapper.optimizer.lr=abc'],
             "optim_wrapper.optimizer.lr must be number (float) or Tensor, got 'abc'")]:
        proc = run_train([TOY_DINO, '--work-dir', str(work), *args], tmp_path)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert message in proc.stderr
        assert 'AmpOptimizerWrapper' not in proc.stderr
        assert not work.exists()


@pytest.mark.slow
def test_one_epoch_of_the_toy_dino_config_trains(toy_root, tmp_path):
    """The override of the issue, ``train_cfg.max_epochs=1`` on the toy DINO config
    (one warm-up epoch of ten): it trains, with one line saying the warm-up was
    removed (was: "end should be larger than begin", exit 1)."""
    work = tmp_path / 'work'
    proc = run_train([TOY_DINO, '--work-dir', str(work), '--cfg-options',
                      'train_cfg.max_epochs=1', f'train_dataloader.dataset.data_root={toy_root}',
                      'train_dataloader.num_workers=0'],
                     tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count('is not longer than the warm-up (LinearLR, 1 epoch): the warm-up '
                     'is removed') == 1
    assert osp.isfile(work / 'epoch_1.pth')
