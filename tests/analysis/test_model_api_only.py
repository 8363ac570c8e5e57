"""analysis/ and studies/ read our models only through their API: no isinstance on
our backbone or mixer classes, and no private attribute of theirs (AST over
analysis/*.py and studies/**/*.py)."""
import ast
import inspect
import os.path as osp
from glob import glob

import torch.nn as nn

import mmdinomamba.models.backbones as backbones
import mmdinomamba.models.mixers as mixers

PACKAGE = osp.join(osp.dirname(osp.abspath(__file__)), '..', '..', 'mmdinomamba')
ANALYSIS = osp.join(PACKAGE, 'analysis')
STUDIES = osp.join(PACKAGE, 'studies')


def our_classes():
    """Names of the nn.Module classes of models/backbones and models/mixers."""
    names = set()
    for package in (backbones, mixers):
        for name, cls in inspect.getmembers(package, inspect.isclass):
            if issubclass(cls, nn.Module) and cls.__module__.startswith('mmdinomamba'):
                names.add(name)
    return names


def private_names():
    """Private (single underscore) attributes defined by our backbones and mixers."""
    names = set()
    for package in (backbones, mixers):
        for _, cls in inspect.getmembers(package, inspect.isclass):
            if cls.__module__.startswith('mmdinomamba'):
                names |= {n for n in vars(cls) if n.startswith('_')
                          and not n.startswith('__')}
    return names


def class_names(node):
    if isinstance(node, ast.Tuple):
        return [n for elt in node.elts for n in class_names(elt)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def findings(source, forbidden_classes, forbidden_private):
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ('isinstance', 'issubclass') and len(node.args) == 2:
            hit = set(class_names(node.args[1])) & forbidden_classes
            if hit:
                out.append(f'line {node.lineno}: {node.func.id} on {sorted(hit)}')
        if isinstance(node, ast.Attribute) and node.attr in forbidden_private and not (
                isinstance(node.value, ast.Name) and node.value.id in ('self', 'cls')):
            out.append(f'line {node.lineno}: private attribute {node.attr}')
    return out


def test_the_check_sees_guessing():
    classes = our_classes()
    assert {'DinoVim', 'LinearViT', 'PlainBackbone', 'SSDMixer',
            'LinearAttention'} <= classes
    assert '_qkv' in private_names() and '_direction_inputs' in private_names()
    planted = ('def f(m, u):\n'
               '    if isinstance(m, (DinoVim, models.LinearViT)):\n'
               '        return m._qkv(u)\n'
               '    return self._qkv(u)\n')
    assert findings(planted, classes, private_names()) == [
        "line 2: isinstance on ['DinoVim', 'LinearViT']",
        'line 3: private attribute _qkv']


def test_analysis_uses_the_model_api_only():
    classes, private = our_classes(), private_names()
    bad = []
    paths = sorted(glob(osp.join(ANALYSIS, '*.py')) +
                   glob(osp.join(STUDIES, '**', '*.py'), recursive=True))
    assert any(p.endswith(osp.join('expressivity', 'probe.py')) for p in paths)
    for path in paths:
        bad += [f'{osp.relpath(path, PACKAGE)} {f}' for f in
                findings(open(path).read(), classes, private)]
    assert not bad, '\n'.join(bad)
