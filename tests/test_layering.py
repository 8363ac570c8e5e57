"""Imports run one way: ``tools -> studies -> analysis -> engine -> {models,
evaluation, datasets} -> ops``, with ``utils`` (safe loading, atomic writes) a leaf
under all of them, and no circle anywhere in the package.

Every module of mmdinomamba/ is parsed (AST, no import), and every ``import`` and
``from ... import`` in it (also inside functions) is resolved to a module of the
package (``from a.b import c`` names the module ``a.b.c`` when there is one, else
``a.b``). Three checks fail with the file and line of the offending import:

* between subpackages, an import against the order above (``registry`` sits on top
  of the package: only the package's own ``__init__`` imports it);
* inside ``ops/``, an import against its own order
  ``blocks -> mixer -> backend -> {ssd, norm, conv, linear_attention} -> spec``
  (``mlla`` beside ``mixer``),
  where ``ops/triton`` (the fused kernels, imported on demand by the dispatchers)
  may import ``spec`` alone;
* anywhere, a circle of imports between modules (one import per module, the first
  one found on the circle, is reported).

No import graph sees a module start a script by its path, so a fourth check reads
the string constants of every module (docstrings left out): none may be a path
into ``tools/`` (``'tools'`` as a path part, ``'tools/train.py'``, the
``'/tools/...'`` of an f-string), and none handed to a process or a loader
(``subprocess``, ``os.system``, ``runpy``, ``spec_from_file_location``, ...) may
name ``tools/``. A sentence that tells the user which tool to run is not a path
(it has spaces) and is allowed; a tool hands the package the command it needs.
"""
import ast
import os
import os.path as osp
import re
from typing import Dict, List, Set, Tuple

import pytest

ROOT = osp.join(osp.dirname(osp.abspath(__file__)), '..', 'mmdinomamba')

# subpackage -> subpackages (and top-level names) it must never import
FORBIDDEN = {
    'ops': ('models', 'evaluation', 'datasets', 'engine', 'analysis', 'studies',
            'registry', 'tools'),
    'models': ('engine', 'analysis', 'studies', 'registry', 'tools'),
    'evaluation': ('engine', 'analysis', 'studies', 'registry', 'tools'),
    'datasets': ('engine', 'analysis', 'studies', 'registry', 'tools'),
    'engine': ('analysis', 'studies', 'registry', 'tools'),
    'analysis': ('studies', 'registry', 'tools'),
    'studies': ('registry', 'tools'),
    'apis': ('analysis', 'studies', 'registry', 'tools'),  # the inferencers, over engine
    'utils': ('ops', 'models', 'evaluation', 'datasets', 'engine', 'analysis',
              'studies', 'registry', 'tools'),
}
# inside ops/: module -> the rank it sits at; a module imports lower ranks only
# (ops/triton: spec alone, whatever its rank says)
OPS_RANK = {'spec': 0, 'ssd': 1, 'norm': 1, 'conv': 1, 'linear_attention': 1,
            'triton': 1, 'backend': 2, 'mixer': 3, 'mlla': 3, 'blocks': 4}
TRITON_MAY_IMPORT = ('spec', )


def modules(top=ROOT):
    """(path, dotted name as a list) of every module under ``top``."""
    for root, _, names in os.walk(top):
        for name in sorted(names):
            if name.endswith('.py'):
                path = osp.join(root, name)
                rel = osp.relpath(path, osp.dirname(top))[:-len('.py')]
                parts = rel.split(os.sep)
                if parts[-1] == '__init__':
                    parts = parts[:-1]
                yield path, parts


def imports(path, parts):
    """(line, dotted module name, names) of every import in the file: ``names`` are
    what ``from module import ...`` takes (empty for ``import module``)."""
    package = parts if path.endswith('__init__.py') else parts[:-1]
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                name = '.'.join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            yield node.lineno, name, tuple(alias.name for alias in node.names)


def imported(path, parts):
    """(line, dotted module name) of every import in the file; ``from mmdinomamba
    import analysis`` names ``mmdinomamba.analysis``."""
    for line, name, names in imports(path, parts):
        if name == 'mmdinomamba' and names:
            for alias in names:
                yield line, f'{name}.{alias}'
        else:
            yield line, name


def upward(layer, name):
    target = name.split('.')
    if target[0] == 'tools':
        return True
    return target[0] == 'mmdinomamba' and len(target) > 1 and \
        target[1] in FORBIDDEN[layer]


def ops_violation(source: List[str], target: str) -> bool:
    """Whether ``source`` (a module of ops/) may not import ``target``."""
    parts = target.split('.')
    if parts[:2] != ['mmdinomamba', 'ops'] or len(parts) < 3 or len(source) < 3:
        return False  # the package itself, or outside ops/
    if parts[2] == source[2]:
        return False  # within one module or subpackage of ops/
    if source[2] == 'triton':
        return parts[2] not in TRITON_MAY_IMPORT
    if source[2] not in OPS_RANK or parts[2] not in OPS_RANK:
        return True  # a module of ops/ without a rank: give it one above
    return OPS_RANK[parts[2]] >= OPS_RANK[source[2]]


def violations(top=ROOT):
    out = []
    for path, parts in modules(top):
        rel = osp.relpath(path, osp.dirname(top))
        for line, name in imported(path, parts):
            if len(parts) >= 2 and parts[1] in FORBIDDEN and upward(parts[1], name):
                out.append(f'{rel}:{line}: {parts[1]} -> {name}')
            elif len(parts) >= 3 and parts[1] == 'ops' and ops_violation(parts, name):
                out.append(f'{rel}:{line}: {".".join(parts[1:])} -> {name}')
    return sorted(set(out))


# Calls that start a process or load a file: a string handed to one may not name
# tools/, not even in a command line with spaces
STARTERS = ('subprocess.run', 'subprocess.call', 'Popen', 'check_call', 'check_output',
            'system', 'popen', 'execv', 'execve', 'execvp', 'execvpe', 'execl',
            'execlp', 'spawnv', 'spawnvp', 'run_path', 'run_module',
            'spec_from_file_location', 'import_module', 'load_source')
# Paths into tools/ that only an error message shows the user (never run here):
# (module, string)
TOOLS_NAMED_FOR_USERS = {
    ('mmdinomamba/utils/safe_load.py', 'tools/model_converters/dinomamba2mmdinomamba.py'),
    ('mmdinomamba/utils/safe_load.py', 'tools/model_converters/mlla2mmdinomamba.py'),
}


def docstrings(tree: ast.AST) -> Set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def is_tools_path(text: str) -> bool:
    """Whether ``text`` is a path with a part ``tools`` (``'tools'``,
    ``'tools/train.py'``, ``'/tools/x'``): one word, no spaces."""
    return not re.search(r'\s', text) and 'tools' in re.split(r'[/\\]', text)


def dotted(node: ast.AST) -> str:
    """``a.b.c`` of a call's function (``''`` for anything but names)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f'{dotted(node.value)}.{node.attr}'.lstrip('.')
    return ''


def starts(call: ast.Call) -> bool:
    name = dotted(call.func)
    return any(name == s or name.endswith('.' + s) for s in STARTERS)


def tools_named(top=ROOT) -> List[str]:
    """``path:line: 'string'`` of every string constant of the package (docstrings
    left out) that is a path into tools/, or that names tools/ in a call that
    starts a process or loads a file."""
    out = set()
    for path, _ in modules(top):
        rel = osp.relpath(path, osp.dirname(top))
        tree = ast.parse(open(path).read(), path)
        skip = docstrings(tree)
        for node in ast.walk(tree):
            strings = []
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    id(node) not in skip and is_tools_path(node.value):
                strings.append(node)
            elif isinstance(node, ast.Call) and starts(node):
                strings.extend(
                    n for arg in [*node.args, *(k.value for k in node.keywords)]
                    for n in ast.walk(arg) if isinstance(n, ast.Constant) and
                    isinstance(n.value, str) and re.search(r'(^|[/\\\s])tools([/\\]|$)',
                                                           n.value))
            for n in strings:
                if (rel, n.value) not in TOOLS_NAMED_FOR_USERS:
                    out.add(f'{rel}:{n.lineno}: {n.value!r}')
    return sorted(out)


def edges(top=ROOT) -> Dict[str, Dict[str, Tuple[str, int]]]:
    """Module -> {imported module of the package: (path, line)}; ``from a import
    b`` is an import of the module ``a.b`` when it exists, else of ``a``."""
    known = {'.'.join(parts): path for path, parts in modules(top)}
    out = {}
    for path, parts in modules(top):
        name = '.'.join(parts)
        found = {}
        for line, module, names in imports(path, parts):
            targets = [f'{module}.{n}' if f'{module}.{n}' in known else module
                       for n in names] or [module]
            for target in targets:
                if target in known and target != name:
                    found.setdefault(target, (osp.relpath(path, osp.dirname(top)),
                                              line))
        out[name] = found
    return out


def circles(graph: Dict[str, Dict[str, Tuple[str, int]]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(component: List[str], graph) -> str:
    """Each module of a circle with one import of it that stays on the circle."""
    members = set(component)
    lines = []
    for v in component:
        for w, (path, line) in graph[v].items():
            if w in members:
                lines.append(f'  {path}:{line}: {v} -> {w}')
                break
    return '\n'.join(lines)


def test_the_walk_finds_the_imports():
    """The walker sees relative, absolute and function-level imports."""
    found = {}
    for path, parts in modules():
        found['.'.join(parts)] = {name for _, name in imported(path, parts)}
    assert 'mmdinomamba.models.mixers.protocol' in \
        found['mmdinomamba.models.mixers.ssd_mixer']  # relative
    assert 'mmdinomamba.ops' in found['mmdinomamba.models.mixers.ssd_mixer']  # absolute
    assert 'mmdinomamba.ops.triton' in found['mmdinomamba.ops.mixer']  # in a function
    assert 'mmdinomamba.models.backbones' in found['mmdinomamba.analysis.adapters']
    assert 'mmdinomamba.analysis.adapters' in \
        found['mmdinomamba.studies.comparison.measures']  # the studies' floor
    graph = edges()
    assert 'mmdinomamba.ops.spec' in graph['mmdinomamba.ops.triton.mixer']  # `..spec`
    assert 'mmdinomamba.ops.triton' in graph['mmdinomamba.ops.backend']


def test_imports_run_downward_only():
    bad = violations()
    assert not bad, 'imports against the layers:\n' + '\n'.join(bad)


def test_no_module_of_the_package_names_a_file_under_tools():
    """The package starts no script of tools/: a tool hands it the command it
    needs (tools/run_recipe.py hands the recipe its train command)."""
    found = tools_named()
    assert not found, ('files under tools/ named by the package (a tool must hand '
                       'the package the command instead):\n' + '\n'.join(found))


def test_the_tools_check_catches_a_planted_script_path(tmp_path):
    """A path built from parts (the recipe once started
    ``osp.join(root, 'tools', 'train.py')``), a path constant, the path part of
    an f-string and a command line handed to a process are reported; docstrings,
    sentences to the user and other names are not."""
    package = tmp_path / 'mmdinomamba' / 'studies'
    package.mkdir(parents=True)
    (package / 'bad.py').write_text(
        'import os\nimport os.path as osp\nimport subprocess\nimport sys\n'
        'def train(root, cfg):\n'
        '    """Runs tools/train.py (a docstring may say so)."""\n'
        "    subprocess.Popen([sys.executable, osp.join(root, 'tools', 'train.py'),\n"
        '                      cfg])\n'
        "SCRIPT = 'tools/train.py'\n"
        "def path(root):\n    return f'{root}/tools/test.py'\n"
        "def shell(cfg):\n    os.system('python tools/train.py ' + cfg)\n")
    (package / 'ok.py').write_text(
        '"""Run ``python tools/train.py CONFIG`` (a docstring)."""\n'
        'class A:\n    """tools/train.py in a class docstring."""\n'
        'def message(cfg):\n'
        "    raise ValueError(f'train it first: python tools/train.py {cfg}')\n"
        "NAMES = ('mytools/x.py', 'tools.py', 'toolsets/a')\n")
    assert tools_named(str(tmp_path / 'mmdinomamba')) == [
        "mmdinomamba/studies/bad.py:11: '/tools/test.py'",
        "mmdinomamba/studies/bad.py:13: 'python tools/train.py '",
        "mmdinomamba/studies/bad.py:7: 'tools'",
        "mmdinomamba/studies/bad.py:9: 'tools/train.py'"]


def test_no_circle_of_imports_anywhere_in_the_package():
    graph = edges()
    found = circles(graph)
    assert not found, 'circles of imports:\n' + '\n'.join(
        describe(c, graph) for c in found)


@pytest.mark.parametrize('source,target', [
    ('ops', 'models'), ('models', 'analysis'), ('models', 'engine'),
    ('evaluation', 'engine'), ('datasets', 'analysis'), ('engine', 'analysis'),
    ('ops', 'engine'), ('analysis', 'tools'), ('utils', 'ops'), ('utils', 'engine'),
    ('analysis', 'studies'), ('engine', 'studies'), ('models', 'studies'),
    ('evaluation', 'studies'), ('datasets', 'studies'), ('studies', 'tools'),
    ('studies', 'registry')])
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


@pytest.mark.parametrize('target', ['ssd', 'mixer', 'blocks', 'backend', 'norm'])
def test_the_rule_keeps_ops_triton_on_the_contracts(tmp_path, target):
    """ops/triton may import ops/spec and its own modules, nothing else of ops/."""
    triton = tmp_path / 'mmdinomamba' / 'ops' / 'triton'
    triton.mkdir(parents=True)
    (triton / 'ok.py').write_text('from ..spec import MixerSpec\nfrom .conv import f\n')
    (triton / 'bad.py').write_text(f'from ..{target} import thing\n')
    assert violations(str(tmp_path / 'mmdinomamba')) == [
        f'mmdinomamba/ops/triton/bad.py:1: ops.triton.bad -> mmdinomamba.ops.{target}']


def test_the_rule_keeps_the_order_inside_ops(tmp_path):
    """Inside ops/ a module imports lower ranks only: the math not the backend, the
    backend not the mixer, the contracts nothing."""
    ops = tmp_path / 'mmdinomamba' / 'ops'
    ops.mkdir(parents=True)
    (ops / 'ssd.py').write_text('from .backend import ssd_scan\nfrom .spec import X\n')
    (ops / 'backend.py').write_text('from .ssd import ssd_ref\nfrom .mixer import m\n')
    (ops / 'spec.py').write_text('import torch\n')
    assert violations(str(tmp_path / 'mmdinomamba')) == [
        'mmdinomamba/ops/backend.py:2: ops.backend -> mmdinomamba.ops.mixer',
        'mmdinomamba/ops/ssd.py:1: ops.ssd -> mmdinomamba.ops.backend']


def test_the_circle_check_finds_a_planted_circle(tmp_path):
    """a -> b -> c -> a through absolute, relative and function-level imports, and a
    package whose submodule imports the package back, are circles; a chain is not."""
    pkg = tmp_path / 'mmdinomamba' / 'x'
    pkg.mkdir(parents=True)
    (tmp_path / 'mmdinomamba' / '__init__.py').write_text('')
    (pkg / '__init__.py').write_text('from .a import f\n')
    (pkg / 'a.py').write_text('from mmdinomamba.x.b import g\n')
    (pkg / 'b.py').write_text('def g():\n    from . import c\n')
    (pkg / 'c.py').write_text('from .a import f\nfrom mmdinomamba import x\n')
    (pkg / 'd.py').write_text('from .a import f\n')  # only into the circle
    graph = edges(str(tmp_path / 'mmdinomamba'))
    assert graph['mmdinomamba.x.b'] == {'mmdinomamba.x.c': ('mmdinomamba/x/b.py', 2)}
    found = circles(graph)
    assert found == [['mmdinomamba.x', 'mmdinomamba.x.a', 'mmdinomamba.x.b',
                      'mmdinomamba.x.c']]
    assert 'mmdinomamba/x/c.py:1: mmdinomamba.x.c -> mmdinomamba.x.a' in \
        describe(found[0], graph)
    (pkg / 'c.py').write_text('import torch\n')
    assert circles(edges(str(tmp_path / 'mmdinomamba'))) == []
