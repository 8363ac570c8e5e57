"""benchmarks/time_training_loop.sh without a GPU: with a stand-in for Python it
runs every step but the training, and each command it would run names files that
exist (the synthetic data script, tools/train.py, the shipped DINO configs)."""
import os
import os.path as osp
import subprocess

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.mark.slow
def test_the_loop_runs_the_shipped_configs(tmp_path):
    log = tmp_path / 'calls.txt'
    stand_in = tmp_path / 'python'
    # records its arguments, one call a line; reads (and drops) a here-document
    stand_in.write_text(f'#!/usr/bin/env bash\necho "$@" >> {log}\n'
                        '[ "$1" = - ] && cat > /dev/null\nexit 0\n')
    stand_in.chmod(0o755)
    env = dict(os.environ, PYTHON=str(stand_in), ITERS='20',
               ROOT=str(tmp_path / 'data'), WORK_DIR=str(tmp_path / 'work'))
    subprocess.run(['bash', osp.join(REPO, 'benchmarks', 'time_training_loop.sh'),
                    'vit-base', 'dinovim-base', 'dinovim-tiny+compile'],
                   cwd=str(tmp_path), env=env, check=True, timeout=60)
    calls = [line.split() for line in log.read_text().splitlines()]
    assert calls[0] == ['benchmarks/make_synthetic_imagenet.py', str(tmp_path / 'data'),
                        str(48 * 20)]
    trains = [c for c in calls if c[0] == 'tools/train.py']
    assert [c[1] for c in trains] == [
        'configs/dino/dino_vit-base-p16_4xb48-amp-100e_in1k.py',
        'configs/dino/dino_dinovim-base-p16_4xb48-amp-100e_in1k.py',
        'configs/dino/dino_dinovim-tiny-p16_4xb48-amp-compile-100e_in1k.py']
    for call in calls:  # every file it names is in the checkout
        if call[0] != '-':
            assert osp.isfile(osp.join(REPO, call[0])), call
    for train in trains:
        assert osp.isfile(osp.join(REPO, train[1])), train
        assert f'train_dataloader.dataset.data_root={tmp_path / "data"}' in train
        assert train[train.index('--work-dir') + 1].startswith(str(tmp_path / 'work'))
