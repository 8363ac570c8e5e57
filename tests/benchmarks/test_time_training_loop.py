"""benchmarks/time_training_loop.sh, the DINO loop's shortcut: with a stand-in for
Python, the command it runs is the benchmark's loop mode on the shipped DINO
configs, with the settings of its environment, and the benchmark takes it."""
import os
import os.path as osp
import subprocess

import pytest

from benchmarks.modes import loop as loop_mode

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.fixture(scope='module')
def bench(load_tool):
    """The command line (its modes are the modules imported above)."""
    return load_tool('benchmarks/benchmark.py')


def run_script(tmp_path, *models, **env):
    log = tmp_path / 'calls.txt'
    stand_in = tmp_path / 'python'
    stand_in.write_text(f'#!/usr/bin/env bash\necho "$@" >> {log}\nexit 0\n')
    stand_in.chmod(0o755)
    subprocess.run(['bash', osp.join(REPO, 'benchmarks', 'time_training_loop.sh'),
                    *models], cwd=str(tmp_path), check=True, timeout=60,
                   env=dict(os.environ, PYTHON=str(stand_in), **env))
    (call, ) = [line.split() for line in log.read_text().splitlines()]
    return call


@pytest.mark.slow
def test_the_loop_runs_the_dino_configs_through_the_benchmark(bench, tmp_path):
    call = run_script(tmp_path, 'vit-base', 'dinovim-base', 'dinovim-tiny+compile',
                      ITERS='20', ROOT=str(tmp_path / 'data'),
                      WORK_DIR=str(tmp_path / 'work'), WORKERS='3')
    assert call[0] == 'benchmarks/benchmark.py'
    assert osp.isfile(osp.join(REPO, call[0]))
    args = bench.parse_args(call[1:])
    assert (args.mode, args.task, args.compile_mode) == ('loop', 'dino', 'reduce-overhead')
    assert (args.train_iters, args.workers) == (20, 3)
    assert (args.root, args.work_dir) == (str(tmp_path / 'data'), str(tmp_path / 'work'))
    assert args.models == ['vit-base', 'dinovim-base', 'dinovim-tiny+compile']
    configs = loop_mode.task_configs('dino')
    for name in args.models:
        assert osp.isfile(configs[name.replace('+compile', '')]), name
    # the defaults: the three DinoVim sizes (ViT-B joins as the baseline)
    (tmp_path / 'defaults').mkdir()
    defaults = bench.parse_args(run_script(tmp_path / 'defaults')[1:])
    assert defaults.models == ['dinovim-base', 'dinovim-small', 'dinovim-tiny']
    assert defaults.train_iters == 30 and defaults.workers == 14
