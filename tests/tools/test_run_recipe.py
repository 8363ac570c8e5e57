"""tools/run_recipe.py, the command line of every recipe preset, and its aliases
tools/run_demo.py and tools/run_comparison.py: which preset each runs, the
checks of its numbers, and the train command it hands the recipe (the recipe:
tests/studies/test_recipe.py; the end-to-end runs: tests/tools/test_run_*.py)."""
import os.path as osp
import sys

import pytest

from mmdinomamba.studies.comparison import recipe
from mmdinomamba.studies.comparison.presets import PRESETS

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.fixture
def handed(monkeypatch):
    """What the tools hand :func:`recipe.run_recipe` (nothing is run)."""
    calls = []

    def run_recipe(preset, root, args, train_command):
        calls.append(dict(preset=preset, root=root, args=args,
                          train_command=train_command))
        return True

    monkeypatch.setattr(recipe, 'run_recipe', run_recipe)
    return calls


@pytest.mark.parametrize('tool,argv,preset', [
    ('tools/run_demo.py', [], 'demo'),
    ('tools/run_comparison.py', [], 'compare'),
    ('tools/run_comparison.py', ['--preset', 'seq256'], 'seq256'),
    ('tools/run_recipe.py', [], 'demo'),
    ('tools/run_recipe.py', ['--preset', 'compare'], 'compare'),
    ('tools/run_recipe.py', ['--preset', 'seq256'], 'seq256'),
])
def test_each_tool_runs_its_preset_with_the_train_command(tool, argv, preset, handed,
                                                          load_tool, capsys):
    """The preset's defaults, the package's own preset object, and the train
    command: this repository's tools/train.py under the running interpreter."""
    load_tool(tool).main([*argv, '--device', 'cpu'])
    call, = handed
    assert call['preset'] is PRESETS[preset]
    assert call['root'] == REPO
    assert call['train_command'] == [sys.executable, osp.join(REPO, 'tools', 'train.py')]
    assert osp.isfile(call['train_command'][1])
    args = call['args']
    assert args.work_dir == osp.join(REPO, PRESETS[preset].work_dir)
    assert args.data_root == osp.join(REPO, PRESETS[preset].data_root)
    assert args.models == [m.name for m in PRESETS[preset].models]
    assert args.device == 'cpu' and args.out is None
    assert 's in all]' in capsys.readouterr().out


def test_a_failed_gate_or_step_exits(monkeypatch, load_tool, capsys):
    """A failed gate exits with status 1; a failed step names the preset and why."""
    tool = load_tool('tools/run_recipe.py')
    monkeypatch.setattr(recipe, 'run_recipe', lambda *args: False)
    with pytest.raises(SystemExit) as exit_:
        tool.main(['--device', 'cpu'])
    assert exit_.value.code == 1

    def fail(*args):
        raise recipe.RecipeError('dinovim-toy: the training run failed')

    monkeypatch.setattr(recipe, 'run_recipe', fail)
    with pytest.raises(SystemExit) as exit_:
        tool.main(['--preset', 'compare', '--device', 'cpu'])
    assert exit_.value.code == 'compare failed: dinovim-toy: the training run failed'


def test_the_command_line_checks_its_numbers(load_tool, capsys):
    tool = load_tool('tools/run_comparison.py')
    with pytest.raises(SystemExit):
        tool.main(['--epochs', '0'])
    assert '--epochs must be >= 1, got 0' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.main(['--models', 'mlp'])
    assert "invalid choice: 'mlp'" in capsys.readouterr().err


def test_the_preset_is_chosen_on_the_command_line(load_tool, capsys):
    """--preset picks the preset whose defaults the rest of the line gets; each
    alias keeps its own choices, and the demo's has no --preset."""
    tool = load_tool('tools/run_recipe.py')
    presets = ('compare', 'seq256')
    for name in presets:
        preset, args = tool.parse_command_line('compare', ['--preset', name], presets)
        assert preset.name == args.preset == name
        assert args.work_dir == osp.join(REPO, PRESETS[name].work_dir)
        assert args.val_per_class == PRESETS[name].data['val_per_class']
        assert args.out is None
    with pytest.raises(SystemExit):
        tool.main(['--preset', 'seq256', '--epochs', '0'])
    assert '--epochs must be >= 1, got 0' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_tool('tools/run_comparison.py').main(['--preset', 'demo'])
    assert "invalid choice: 'demo' (choose from 'compare', 'seq256')" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.main(['--preset', 'seq512'])
    assert "invalid choice: 'seq512'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_tool('tools/run_demo.py').main(['--preset', 'seq256'])
    assert 'unrecognized arguments: --preset' in capsys.readouterr().err
