"""Every script of tools/ and benchmarks/ answers ``--help`` from any folder:
exit status 0, a usage text, and no file written anywhere (a script that ran its
job instead once wrote 1,441 JPEGs); the shell scripts that need arguments print
their usage without them. ``--help`` answers in under 2 s: a Python tool imports
torch, the package and the OpenMMLab libraries only after it has parsed its
arguments (importing them takes 5-10 s)."""
import ast
import glob
import json
import os
import os.path as osp
import runpy
import subprocess
import sys
import time

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def scripts(*patterns: str):
    return sorted(osp.relpath(p, REPO) for pattern in patterns
                  for p in glob.glob(osp.join(REPO, pattern), recursive=True))


# the benchmark's modules beside its command line (benchmarks/benchmark.py): imported
# by it, not run
LIBRARY = ('benchmarks/common.py', 'benchmarks/names.py',
           'benchmarks/triton_launch_internals.py')
PY_TOOLS = [p for p in scripts('tools/**/*.py', 'benchmarks/*.py') if p not in LIBRARY]
# tools/setup/gxx_cpp20 is left out: a compiler wrapper that hands every argument
# to g++ (mmcv's build calls it), not a command for users
SH_TOOLS = scripts('tools/**/*.sh', 'benchmarks/*.sh')
# the shell scripts with required arguments
NEEDS_ARGUMENTS = ('tools/dist_train.sh', 'tools/dist_test.sh', 'tools/slurm_train.sh',
                   'tools/slurm_test.sh')


def files_under(root: str) -> dict:
    """{path: modification time} of every file under ``root`` (caches and the
    environment left out)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ('.git', '.venv', '__pycache__',
                                                '.pytest_cache')]
        for name in files:
            path = osp.join(folder, name)
            found[path] = os.stat(path).st_mtime_ns
    return found


def test_every_script_is_covered():
    assert len(PY_TOOLS) >= 15 and 'tools/analysis/count_params.py' in PY_TOOLS
    for module in LIBRARY:  # a module left out here is no script
        with open(osp.join(REPO, module)) as f:
            assert "__name__ == '__main__'" not in f.read(), module
    assert set(NEEDS_ARGUMENTS) < set(SH_TOOLS)
    assert 'benchmarks/time_training_loop.sh' in SH_TOOLS
    assert 'tools/setup/install.sh' in SH_TOOLS


@pytest.mark.parametrize('tool', PY_TOOLS)
def test_python_tool_help(tool, tmp_path, monkeypatch, capsys):
    """``python TOOL --help`` in an empty folder, run in this process (the tools'
    imports are shared): exit 0, the usage, nothing written."""
    before = files_under(REPO)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, 'argv', [osp.join(REPO, tool), '--help'])
    monkeypatch.setattr(sys, 'path', list(sys.path))
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(osp.join(REPO, tool), run_name='__main__')
    assert exit_.value.code in (0, None)
    assert capsys.readouterr().out.startswith('usage: ')
    assert os.listdir(tmp_path) == []
    assert files_under(REPO) == before


def run_script(tool: str, args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(['bash', osp.join(REPO, tool), *args], cwd=str(cwd),
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHON='/nonexistent/python'))


@pytest.mark.slow
@pytest.mark.parametrize('tool', SH_TOOLS)
def test_shell_script_help(tool, tmp_path):
    before = files_under(REPO)
    for flag in ('--help', '-h'):
        proc = run_script(tool, [flag], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f'usage: {tool} ')
    assert os.listdir(tmp_path) == []
    assert files_under(REPO) == before


@pytest.mark.slow
@pytest.mark.parametrize('tool', NEEDS_ARGUMENTS)
def test_shell_script_without_arguments_prints_its_usage(tool, tmp_path):
    proc = run_script(tool, [], tmp_path)
    assert proc.returncode == 2
    assert 'are required' in proc.stderr and f'usage: {tool} ' in proc.stderr
    assert 'unbound variable' not in proc.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_slurm_train_hands_the_job_to_srun(tmp_path):
    """The command srun receives: the GPU and CPU counts from the environment,
    tools/train.py with the config, the work dir, the slurm launcher and the
    extra arguments (an ``srun`` stand-in records it)."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'srun').write_text(
        f'#!/usr/bin/env bash\necho "$@" > {tmp_path}/srun.txt\n')
    (bin_dir / 'srun').chmod(0o755)
    env = dict(os.environ, PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}',
               GPUS='16', GPUS_PER_NODE='8', CPUS_PER_TASK='4',
               SRUN_ARGS='--quotatype=auto', PYTHON='python3')
    subprocess.run(['bash', osp.join(REPO, 'tools', 'slurm_train.sh'), 'part', 'job',
                    'configs/x.py', 'work', '--amp'], cwd=str(tmp_path), env=env,
                   check=True, timeout=60)
    args = (tmp_path / 'srun.txt').read_text().split()
    assert args[:8] == ['-p', 'part', '--job-name=job', '--gres=gpu:8', '--ntasks=16',
                        '--ntasks-per-node=8', '--cpus-per-task=4',
                        '--kill-on-bad-exit=1']
    assert args[8:] == ['--quotatype=auto', 'python3', '-u',
                        osp.join(REPO, 'tools', 'train.py'), 'configs/x.py',
                        '--work-dir=work', '--launcher=slurm', '--amp']


# What a tool may import before it parses its arguments: the standard library,
# numpy, PIL and mmengine.config (DictAction, 0.3 s); not these, which take seconds
HEAVY = ('torch', 'torchvision', 'mmdinomamba', 'mmpretrain', 'mmseg', 'mmdet', 'mmcv',
         'mmengine', 'matplotlib', 'sklearn', 'scipy', 'timm', 'triton', 'cv2')
LIGHT = ('mmengine.config', )
# the package file (data only) that tools/run_recipe.py reads on its own for its --help
READ_ON_ITS_OWN = ('mmdinomamba/studies/comparison/presets.py', )


def module_level_imports(source: str) -> list:
    """The modules a file imports when it is loaded: every import statement
    outside function and class bodies (those inside ``if``/``try`` too)."""
    found = []

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.Import):
                found.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                found.append('.' * node.level + (node.module or ''))
            for field in ('body', 'orelse', 'finalbody', 'handlers'):
                visit(getattr(node, field, []))

    visit(ast.parse(source).body)
    return found


def heavy(modules) -> list:
    return sorted(m for m in modules if m.startswith('.') or (
        m.split('.')[0] in HEAVY and not m.startswith(LIGHT)))


@pytest.mark.parametrize('path', PY_TOOLS + list(READ_ON_ITS_OWN))
def test_heavy_imports_come_after_argument_parsing(path):
    with open(osp.join(REPO, path), encoding='utf-8') as f:
        found = heavy(module_level_imports(f.read()))
    assert not found, (f'{path} imports {found} when it is loaded: import them in '
                       'main() after parse_args, so that --help answers at once')


def test_the_import_check_catches_a_heavy_import():
    source = ('import os\nimport torch\nfrom mmengine.config import DictAction\n'
              'try:\n    from mmdinomamba.ops import BACKENDS\nexcept ImportError:\n'
              '    pass\nfrom . import sibling\nfrom mmengine.runner import Runner\n'
              'def main():\n    import mmpretrain\n')
    assert heavy(module_level_imports(source)) == [
        '.', 'mmdinomamba.ops', 'mmengine.runner', 'torch']


@pytest.mark.slow
def test_every_help_answers_without_the_heavy_imports(tmp_path):
    """All the Python tools' ``--help`` in one fresh process: none loads torch or
    the package, and each answers well under 2 s."""
    script = tmp_path / 'helps.py'
    script.write_text(f"""
import contextlib, io, json, runpy, sys, time
times = {{}}
for tool in {PY_TOOLS!r}:
    sys.argv = [tool, '--help']
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_path({REPO!r} + '/' + tool, run_name='__main__')
        except SystemExit:
            pass
    times[tool] = time.perf_counter() - start
print(json.dumps(dict(times=times, loaded=sorted(m for m in sys.modules
                                             if m.split('.')[0] in {HEAVY!r}))))
""")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO))
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # (mmengine.config loads parts of mmengine, not torch: the structural test above
    # keeps the rest of mmengine out)
    assert [m for m in result['loaded'] if m.split('.')[0] != 'mmengine'] == []
    slow = {tool: t for tool, t in result['times'].items() if t > 2.0}
    assert not slow, f'--help took over 2 s: {slow}'
    assert wall < 2.0 * len(PY_TOOLS)


@pytest.mark.parametrize('tool,argv,named', [
    ('tools/make_toy_data.py', ['{tmp}/toy', '--style', 'fancy'], "'rich'"),
    ('tools/make_toy_data.py', ['{tmp}/toy', '--formats', 'voc'], "'imagenet'"),
    ('tools/analysis/compare_mixers.py',
     ['--model', 'a', 'c.py', 'random', '--out-dir', '{tmp}/o', '--data-root', '{tmp}',
      '--maps', 'gradcam'], "'attention'"),
    ('benchmarks/benchmark.py', ['kernel', '--backends', 'cudnn'], "'chunked'"),
    ('benchmarks/benchmark.py', ['models', '--ssd-backend', 'cudnn'], "'auto'"),
])
def test_choices_checked_after_parsing_are_usage_errors(tool, argv, named, tmp_path,
                                                        load_tool, capsys):
    """Choices that come from the package are checked once it is imported, after
    parsing: still argparse's usage error (exit status 2) naming the choices, and
    nothing written."""
    module = load_tool(tool)
    with pytest.raises(SystemExit) as exit_:
        module.main([a.format(tmp=tmp_path) for a in argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('usage: ') and named in err, err
    assert os.listdir(tmp_path) == []
