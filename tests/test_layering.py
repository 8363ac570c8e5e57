"""Imports run downward only: tools -> analysis / evaluation -> models -> ops.

Every module of mmdinomamba/ is parsed (AST, no import), every ``import`` and
``from ... import`` in it (also inside functions) is resolved to a package path,
and the imports that go up a layer fail the test with the file and line.
"""
import ast
import os
import os.path as osp

import pytest

ROOT = osp.join(osp.dirname(osp.abspath(__file__)), '..', 'mmdinomamba')

# subpackage -> subpackages (and top-level names) it must never import
FORBIDDEN = {
    'ops': ('models', 'analysis', 'evaluation', 'engine', 'datasets', 'registry',
            'tools'),
    'models': ('analysis', 'evaluation', 'engine', 'datasets', 'registry', 'tools'),
    'evaluation': ('analysis', 'tools'),
    'analysis': ('tools', ),
    'datasets': ('analysis', 'evaluation', 'tools'),
    'engine': ('analysis', 'tools'),
}


def modules(top=ROOT):
    for root, _, names in os.walk(top):
        for name in sorted(names):
            if name.endswith('.py'):
                path = osp.join(root, name)
                rel = osp.relpath(path, osp.dirname(top))[:-len('.py')]
                parts = rel.split(os.sep)
                if parts[-1] == '__init__':
                    parts = parts[:-1]
                yield path, parts


def imported(path, parts):
    """(line, dotted module name) of every import in the file."""
    package = parts if path.endswith('__init__.py') else parts[:-1]
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                name = '.'.join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            if name == 'mmdinomamba':  # `from mmdinomamba import analysis`
                for alias in node.names:
                    yield node.lineno, f'{name}.{alias.name}'
            else:
                yield node.lineno, name


def upward(layer, name):
    target = name.split('.')
    if target[0] == 'tools':
        return True
    return target[0] == 'mmdinomamba' and len(target) > 1 and \
        target[1] in FORBIDDEN[layer]


def violations(top=ROOT):
    out = []
    for path, parts in modules(top):
        if len(parts) < 2 or parts[1] not in FORBIDDEN:
            continue
        for line, name in imported(path, parts):
            if upward(parts[1], name):
                out.append(f'{osp.relpath(path, osp.dirname(top))}:{line}: '
                           f'{parts[1]} -> {name}')
    return out


def test_the_walk_finds_the_imports():
    """The walker sees relative, absolute and function-level imports."""
    found = {}
    for path, parts in modules():
        found['.'.join(parts)] = {name for _, name in imported(path, parts)}
    assert 'mmdinomamba.models.mixers.protocol' in \
        found['mmdinomamba.models.mixers.ssd_mixer']  # relative
    assert 'mmdinomamba.ops' in found['mmdinomamba.models.mixers.ssd_mixer']  # absolute
    assert 'mmdinomamba.ops.triton' in \
        found['mmdinomamba.models.mixers.ssd_mixer']  # inside a method
    assert 'mmdinomamba.models.backbones' in found['mmdinomamba.analysis.adapters']


def test_imports_run_downward_only():
    bad = violations()
    assert not bad, 'imports against the layers:\n' + '\n'.join(bad)


@pytest.mark.parametrize('source,target', [('ops', 'models'), ('models', 'analysis'),
                                           ('models', 'evaluation'),
                                           ('models', 'engine'), ('ops', 'engine')])
def test_the_rule_catches_an_upward_import(tmp_path, source, target):
    """Planted upward imports are reported (so the test above can fail)."""
    package = tmp_path / 'mmdinomamba' / source / 'sub'
    package.mkdir(parents=True)
    (package / 'bad.py').write_text(
        f'from mmdinomamba.{target} import thing\n'
        f'def f():\n    from ...{target}.x import y\n')
    (package / 'ok.py').write_text('import torch\nfrom . import bad\n')
    assert violations(str(tmp_path / 'mmdinomamba')) == [
        f'mmdinomamba/{source}/sub/bad.py:1: {source} -> mmdinomamba.{target}',
        f'mmdinomamba/{source}/sub/bad.py:3: {source} -> mmdinomamba.{target}.x']
