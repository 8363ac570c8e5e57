"""benchmarks/results and the benchmark's output: the ``code`` column is a commit
(with ``+dirty`` for uncommitted changes), written at run time; and the benchmark's
files stay small (one module per mode, none above 600 lines)."""
import csv
import glob
import json
import os.path as osp
import re
import subprocess

import pytest

from benchmarks import common

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
RESULTS = osp.join(REPO, 'benchmarks', 'results')
COMMIT = re.compile(r'^[0-9a-f]{7,40}(\+dirty)?$')


def committed_codes():
    """(file, code) of every row of the committed results that has a code."""
    codes = []
    for path in sorted(glob.glob(osp.join(RESULTS, '*.csv'))):
        with open(path, newline='') as f:
            codes += [(osp.basename(path), row['code']) for row in csv.DictReader(f)
                      if 'code' in row]
    for path in sorted(glob.glob(osp.join(RESULTS, '*.json'))):
        with open(path) as f:
            codes.append((osp.basename(path), json.load(f)['environment']['code']))
    return codes


def test_the_committed_results_name_a_commit():
    codes = committed_codes()
    assert len({name for name, _ in codes}) >= 7  # every mode's CSV and the JSONs
    bad = [(name, code) for name, code in codes if not COMMIT.match(code)]
    assert not bad, bad
    for prose in ('unknown', '2026-12-01, the fast launcher', 'final code of 2026-11-29'):
        assert not COMMIT.match(prose)


def test_the_committed_codes_are_commits_of_this_repository():
    """Each named commit exists in the history (a clone with its history; a
    shallow copy without it cannot tell, and says so)."""
    if not osp.isdir(osp.join(REPO, '.git')) and not osp.isfile(osp.join(REPO, '.git')):
        pytest.fail('the repository has no .git: run the tests in a git checkout')
    for code in sorted({code for _, code in committed_codes()}):
        done = subprocess.run(['git', '-C', REPO, 'cat-file', '-e', code + '^{commit}'],
                              capture_output=True)
        assert done.returncode == 0, f'{code} is no commit of this repository'


def git(repo, *args):
    return subprocess.run(['git', '-C', str(repo), '-c', 'user.name=t', '-c',
                           'user.email=t@t', *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_code_version_is_the_commit_and_a_dirty_flag(tmp_path, monkeypatch):
    """Against git itself, in a repository made here: the short hash; '+dirty'
    once a tracked file changes (an untracked file alone leaves it clean);
    'unknown' outside a checkout."""
    git(tmp_path, 'init', '-q')
    (tmp_path / 'a.txt').write_text('1\n')
    git(tmp_path, 'add', 'a.txt')
    git(tmp_path, 'commit', '-q', '-m', 'one')
    head = git(tmp_path, 'rev-parse', '--short', 'HEAD')
    assert common.code_version(str(tmp_path)) == head
    (tmp_path / 'new.txt').write_text('untracked\n')
    assert common.code_version(str(tmp_path)) == head
    (tmp_path / 'a.txt').write_text('2\n')
    assert common.code_version(str(tmp_path)) == head + '+dirty'
    outside = tmp_path / 'outside'
    outside.mkdir()
    assert common.code_version(str(outside)) == head + '+dirty'  # inside the checkout
    monkeypatch.setenv('GIT_CEILING_DIRECTORIES', str(tmp_path))  # git stops above it
    assert common.code_version(str(outside)) == 'unknown'


def test_code_version_without_git(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError('git')

    monkeypatch.setattr(common.subprocess, 'run', missing)
    assert common.code_version(REPO) == 'unknown'


def test_csv_rows_lead_with_date_card_code_command(tmp_path):
    """``--out FILE.csv``: the rows as the committed CSVs have them, the figures
    after the four leading columns, a list of runs joined by spaces."""
    result = dict(environment=dict(date='2026-12-06', code='7bff3d3+dirty',
                                   device='cuda', gpu='NVIDIA H100 80GB HBM3'),
                  command='benchmark.py kernel', rows=[
                      dict(backend='chunked', fwd_ms=1.5, fwd_ms_all=[1.5, 1.75]),
                      dict(backend='triton', error='no GPU')])
    out = tmp_path / 'k.csv'
    common.write_result(result, str(out))
    with open(out, newline='') as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:4] == ['date', 'card', 'code', 'command']
    assert rows[0]['card'] == 'NVIDIA H100 80GB HBM3' and rows[0]['code'] == '7bff3d3+dirty'
    assert rows[0]['fwd_ms_all'] == '1.5 1.75' and rows[1]['error'] == 'no GPU'
    assert rows[1]['fwd_ms'] == '' and len(rows) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ['k.csv']  # no temp file left


def test_the_cli_writes_the_running_commit(load_tool, tmp_path):
    """A CPU kernel run, CSV and JSON: ``code`` is this checkout's commit."""
    bench = load_tool('benchmarks/benchmark.py')
    expected = common.code_version()
    argv = ['--device', 'cpu', '--amp', 'none', '--warmup', '0', '--repeats', '1',
            '--iters', '1', '--out', None, 'kernel', '--backends', 'chunked', '--batch',
            '1', '--seqlen', '8', '--nheads', '1', '--headdim', '4', '--dstate', '4']
    argv[argv.index(None)] = str(tmp_path / 'k.csv')
    bench.main(argv)
    with open(tmp_path / 'k.csv', newline='') as f:
        (row, ) = list(csv.DictReader(f))
    assert row['code'] == expected and COMMIT.match(expected)
    assert row['backend'] == 'chunked' and float(row['fwd_ms']) > 0
    argv[argv.index(str(tmp_path / 'k.csv'))] = str(tmp_path / 'k.json')
    bench.main(argv)
    assert json.loads((tmp_path / 'k.json').read_text())['environment']['code'] == expected


def test_no_benchmark_file_is_above_600_lines():
    files = glob.glob(osp.join(REPO, 'benchmarks', '*.py')) + glob.glob(
        osp.join(REPO, 'benchmarks', '*', '*.py'))
    assert len(files) >= 12  # the command line, common.py, the modes, the scripts
    sizes = {}
    for path in files:
        with open(path) as f:
            sizes[osp.relpath(path, REPO)] = sum(1 for _ in f)
    assert max(sizes.values()) <= 600, {p: n for p, n in sizes.items() if n > 600}
    assert sizes['benchmarks/benchmark.py'] <= 300  # the command line only
