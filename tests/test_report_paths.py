"""Committed report files hold repository-relative paths only: no path of the
machine that made them (``/work/...``, ``/home/...``, ``/tmp/...``, a drive)."""
import glob
import json
import os.path as osp
import re

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
ABSOLUTE = re.compile(r'(?<![\w.:/])(/(?:work|home|root|tmp|mnt|Users|data|scratch)/'
                      r'[^\s"\'|)]*|[A-Za-z]:\\\\[^\s"\']*)')


# the folders that hold shipped files (work_dirs/ and data/ are a user's own)
SHIPPED = ('docs', 'configs', 'results', 'benchmarks', 'tests', 'mmdinomamba', 'tools')


def _shipped(ext):
    return sorted(osp.relpath(p, ROOT) for top in SHIPPED for p in glob.glob(
        osp.join(ROOT, top, '**', f'*.{ext}'), recursive=True))


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_committed_json_holds_no_absolute_paths():
    files = _shipped('json')
    assert files, 'no JSON file found: the test would check nothing'
    bad = []
    for name in files:
        with open(osp.join(ROOT, name)) as f:
            try:
                data = json.load(f)
            except ValueError:
                continue
        bad += [f'{name}: {s}' for s in _strings(data)
                if s.startswith('/') or ABSOLUTE.search(s)]
    assert not bad, 'absolute paths in committed JSON:\n' + '\n'.join(bad[:20])


def test_committed_reports_hold_no_absolute_paths():
    # the reports the tools wrote (the pages' example commands may name /data)
    files = [n for n in _shipped('md') if n.startswith(osp.join('docs', 'images'))]
    assert files
    bad = []
    for name in files:
        with open(osp.join(ROOT, name)) as f:
            for number, line in enumerate(f, 1):
                if ABSOLUTE.search(line):
                    bad.append(f'{name}:{number}: {line.strip()[:120]}')
    assert not bad, 'absolute paths in committed docs:\n' + '\n'.join(bad[:20])


def test_the_pattern_finds_what_it_should():
    assert ABSOLUTE.search('| /work/main/.gpu_i47/work_dirs/x.pth |')
    assert ABSOLUTE.search('"/home/user/run/epoch_2.pth"')
    assert not ABSOLUTE.search('work_dirs/compare_seq256/vit_teacher.pth')
    assert not ABSOLUTE.search('https://github.com/x/y/tree/main/tmp/z')
