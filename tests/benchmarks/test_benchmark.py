"""benchmarks/benchmark.py (the harness and its command line) on the CPU, tiny."""
import json
import os.path as osp

import pytest
import torch

from benchmarks import common, names
from benchmarks.modes import dino_step
from benchmarks.modes import host as host_mode
from benchmarks.modes import models as models_mode
from benchmarks.modes import profile as profile_mode

TOY_DINO = osp.join(osp.dirname(__file__), '..', '..', 'configs', 'dino',
                    'dino_dinovim-toy-p8_1xb8-10e_toy.py')


@pytest.fixture(scope='module')
def bench(load_tool):
    """The command line (its modes are the modules imported above)."""
    return load_tool('benchmarks/benchmark.py')


TINY = dict(type='DinoVim', arch=dict(embed_dims=64, num_layers=2),
            mixer_cfg=dict(d_state=16, headdim=16))
TINY_LINEAR = dict(type='LinearViT', arch=dict(embed_dims=64, num_layers=2,
                                               num_heads=2, mlp_ratio=2))


def test_models_mode_measures_and_ratios(bench):
    rows = models_mode.run_models({'tiny': TINY, 'base': TINY_LINEAR}, sizes=[32],
                            batches=[2], device=torch.device('cpu'), amp=None,
                            modes=['infer', 'train'], warmup=1, repeats=2, iters=1,
                            baseline='base')
    by_name = {r['model']: r for r in rows}
    tiny, base = by_name['tiny'], by_name['base']
    for r in rows:
        assert 'error' not in r, r
        assert r['infer_img_s'] > 0 and r['train_img_s'] > 0
        assert len(r['train_ms_all']) == 2
        assert r['train_img_s'] == pytest.approx(2e3 / r['train_ms'])
        # the host's work, counted: a training step issues more than a forward
        assert 0 < r['infer_ops'] < r['train_ops']
        assert 0 < r['infer_pycalls'] < r['train_pycalls']
    head = models_mode.format_table(rows, 'base').splitlines()[0].split()
    assert {'iHostMs', 'hostMs', 'torchOps'} <= set(head)
    assert tiny['ssd_path'] == 'chunked'
    assert tiny['infer_vs_baseline'] == pytest.approx(
        tiny['infer_img_s'] / base['infer_img_s'])
    assert base['train_vs_baseline'] == pytest.approx(1.0)


def test_models_mode_reports_errors_and_goes_on(bench):
    rows = models_mode.run_models({'bad': dict(type='NoSuchNet'), 'tiny': TINY}, sizes=[32],
                            batches=[1], device=torch.device('cpu'), amp=None,
                            modes=['infer'], warmup=0, repeats=1, iters=1,
                            baseline=None)
    assert 'NoSuchNet' in rows[0]['error']
    assert rows[1]['infer_img_s'] > 0


def test_models_mode_needs_one_batch_per_size(bench):
    with pytest.raises(ValueError, match='one batch size per input size'):
        models_mode.run_models({'tiny': TINY}, sizes=[32, 64], batches=[2],
                         device=torch.device('cpu'), amp=None, modes=['infer'],
                         warmup=0, repeats=1, iters=1)


def test_cli_writes_json(bench, tmp_path):
    out = tmp_path / 'res' / 'bench.json'
    bench.main(['--device', 'cpu', '--amp', 'none', '--warmup', '0', '--repeats', '1',
                '--iters', '1', '--out', str(out), 'kernel', '--backends', 'chunked',
                'ref', 'triton', '--batch', '1', '--seqlen', '20', '--nheads', '2',
                '--headdim', '8', '--dstate', '8'])
    data = json.loads(out.read_text())
    rows = {r['backend']: r for r in data['rows']}
    assert data['mode'] == 'kernel' and data['environment']['device'] == 'cpu'
    assert rows['chunked']['fwd_ms'] > 0 and rows['ref']['fwd_bwd_ms'] > 0
    assert 'CUDA' in rows['triton']['error']  # no GPU here: reported, not raised
    assert list(tmp_path.joinpath('res').iterdir()) == [out]  # no temp files left


def test_profile_mode_splits_a_step_by_operator(bench, tmp_path):
    common.model_table()['tiny-test'] = TINY
    try:
        out = tmp_path / 'prof.json'
        data = bench.main(['--device', 'cpu', '--amp', 'none', '--warmup', '1',
                           '--iters', '2', '--out', str(out), 'profile', '--model',
                           'tiny-test', '--size', '32', '--batch', '2', '--step', 'train',
                           '--top', '5', '--host'])
    finally:
        del common.model_table()['tiny-test']
    rows = data['rows']
    times = [r['ms_per_step'] for r in rows]
    assert times == sorted(times, reverse=True) and times[-1] > 0
    names = {r['name'] for r in rows}
    # a training step: the projections' matrix products, their backward, AdamW
    assert any('mm' in n for n in names), sorted(names)[:20]
    assert any('Backward' in n or 'backward' in n for n in names)
    settings = json.loads(out.read_text())['settings']
    assert settings['step'] == 'train' and settings['host'] is True
    with pytest.raises(ValueError, match="step must be 'infer' or 'train'"):
        profile_mode.profile_model(TINY, 32, 1, torch.device('cpu'), None, 'eval', 0, 1)


@pytest.mark.slow
def test_dino_step_runs_the_configs_training_step(bench):
    """The DINO step of a config, built through the registry, as the Runner runs it:
    it trains (the student's weights move, the teacher follows by EMA), and the
    figures are reported per row with ratios to the baseline row."""
    step, model, batch = dino_step.build_dino_step(TOY_DINO, torch.device('cpu'), batch=2)
    assert batch == 2
    before = [p.detach().clone() for p in model.backbone.parameters()]
    teacher_before = [p.detach().clone() for p in model.teacher.parameters()]
    log = step()
    assert set(log) >= {'loss'} and torch.isfinite(log['loss'])
    step()  # the teacher moves towards the student updated by the first step
    assert any(not torch.equal(a, b) for a, b in zip(before, model.backbone.parameters()))
    assert any(not torch.equal(a, b)
               for a, b in zip(teacher_before, model.teacher.parameters()))
    rows = dino_step.run_dino_steps({'toy': TOY_DINO, 'toy2': TOY_DINO}, torch.device('cpu'),
                                warmup=0, repeats=1, iters=1, baseline='toy',
                                host_batch=2)
    for r in rows:
        assert 'error' not in r, r
        assert r['s_iter'] > 0 and r['host_ms'] > 0 and r['launches'] is None
        assert r['pycalls'] > 0 and r['ops'] > 0
        assert r['img_s'] == pytest.approx(r['batch'] / r['s_iter'])
    assert rows[0]['img_s_vs_baseline'] == 1.0
    assert 'toy' in dino_step.format_dino_table(rows, 'toy')


def test_dino_step_compiles_both_backbones_when_asked(bench):
    """As CompileModulesHook does: in place, the heads stay eager (compilation
    itself is lazy, so nothing is compiled here)."""
    _, model, _ = dino_step.build_dino_step(TOY_DINO, torch.device('cpu'), batch=2,
                                        compile_mode='default')
    assert model.backbone._compiled_call_impl is not None
    assert model.teacher['backbone']._compiled_call_impl is not None
    assert model.head._compiled_call_impl is None
    with pytest.raises(ValueError, match='separate run'):
        models_mode.run_models({}, [224], [1], torch.device('cpu'), None, ['train'], 0, 1, 1,
                         graph=True, compile_mode='reduce-overhead')


@pytest.mark.slow
def test_dino_step_graphs_the_blocks_as_the_config_or_the_flag_says(bench):
    """As tools/train.py with CUDAGraphBlocksHook: both backbones switched to their
    graphed blocks (they run eagerly here, on the CPU); the row says so."""
    from mmdinomamba.engine.graphed_blocks import GraphedStack

    def graphed(backbone):
        return isinstance(backbone.stack_runner, GraphedStack)

    _, plain, _ = dino_step.build_dino_step(TOY_DINO, torch.device('cpu'), batch=2)
    assert not graphed(plain.backbone)
    assert not graphed(plain.teacher['backbone'])
    _, model, _ = dino_step.build_dino_step(TOY_DINO, torch.device('cpu'), batch=2,
                                        graph_blocks=True)
    assert graphed(model.backbone) and graphed(model.teacher['backbone'])
    hooked, hooked_model, _ = dino_step.build_dino_step(
        TOY_DINO, torch.device('cpu'), batch=2,
        cfg_options=dict(custom_hooks=[dict(type='CUDAGraphBlocksHook')]))
    rows = dino_step.run_dino_steps({'toy': TOY_DINO}, torch.device('cpu'), 0, 1, 1,
                                host_batch=0, graph_blocks=True)
    assert rows[0]['graph_blocks'] and 'graph-blocks' in dino_step.format_dino_row(rows[0])
    assert graphed(hooked_model.backbone)
    assert torch.isfinite(hooked()['loss'])
    # graph_blocks=False (--eager-blocks): eager although the config holds the hook
    _, eager, _ = dino_step.build_dino_step(
        TOY_DINO, torch.device('cpu'), batch=2, graph_blocks=False,
        cfg_options=dict(custom_hooks=[dict(type='CUDAGraphBlocksHook')]))
    assert not graphed(eager.backbone)
    args = bench.parse_args(['dino-step', '--eager-blocks'])
    assert args.graph_blocks is False
    assert bench.parse_args(['dino-step']).graph_blocks is None


def test_dino_step_reports_a_config_that_does_not_build(bench):
    rows = dino_step.run_dino_steps({'missing': 'configs/dino/no_such.py'},
                                torch.device('cpu'), 0, 1, 1)
    assert 'no_such.py' in rows[0]['error']


def test_host_ms_times_one_call(bench):
    calls = []
    t = common.host_ms(lambda: calls.append(1), torch.device('cpu'), repeats=3)
    assert len(t) == 3 and len(calls) == 3 and all(x >= 0 for x in t)
    assert common.launches_per_call(lambda: None, torch.device('cpu')) is None


def _nested(n: int):
    """Makes exactly n calls: of ``_leaf`` (``range`` is a type; cProfile counts
    functions and built-in functions)."""
    for _ in range(n):
        _leaf()


def _leaf():
    pass


def test_python_calls_per_call_counts_every_call(bench):
    """Against a function whose calls are counted by hand: ``_nested(n)`` calls
    ``_leaf`` n times, and ``fn`` itself is not counted."""
    assert common.python_calls_per_call(lambda: None) == 0
    for n in (0, 1, 7, 100):
        # the lambda calls _nested (1), which calls _leaf n times
        assert common.python_calls_per_call(lambda: _nested(n)) == n + 1
    assert common.python_calls_per_call(lambda: len([])) == 1  # a built-in counts
    # a step counts the same twice: a figure, not a timing
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    counts = {common.python_calls_per_call(lambda: model(x)) for _ in range(3)}
    assert len(counts) == 1 and counts.pop() > 5


def test_operators_per_call_counts_the_operators_python_issues(bench):
    """Against operators counted by hand: an operator that calls others inside
    (``F.linear``: ``t`` and ``mm``) is one; the autograd engine's count too."""
    x, w = torch.randn(4, 4), torch.randn(3, 4)
    assert common.operators_per_call(lambda: None) == 0
    assert common.operators_per_call(lambda: x + 1) == 1
    assert common.operators_per_call(lambda: torch.nn.functional.linear(x, w)) == 1
    assert common.operators_per_call(lambda: (x.view(16), x.t(), x.sum())) == 3
    # the same in a loop: n operators
    for n in (2, 5):
        assert common.operators_per_call(lambda: [x.mul(2) for _ in range(n)]) == n
    # a backward: the engine issues operators too, and more for a longer graph
    a = torch.randn(4, requires_grad=True)
    short = (a * 2).sum()
    long = (a * 2).exp().sin().sum()
    n_short = common.operators_per_call(lambda: short.backward(retain_graph=True))
    n_long = common.operators_per_call(lambda: long.backward(retain_graph=True))
    assert 0 < n_short < n_long


def test_models_table_puts_each_host_time_under_its_column(bench):
    row = dict(model='m', img_size=32, batch=2, infer_img_s=10.0, infer_host_ms=12.34,
               train_host_ms=56.78, train_launches=9, train_pycalls=8, train_ops=7)
    head, _, line = models_mode.format_table([row], None).splitlines()
    # the seven columns before 'ssd' (empty here), read from the right
    cells = dict(zip(head.split()[-8:-1], line.split()[-7:]))
    assert (cells['iHostMs'], cells['hostMs']) == ('12.3', '56.8')
    assert (cells['launches'], cells['pyCalls'], cells['torchOps']) == ('9', '8', '7')


def test_best_of_rounds_keeps_the_fastest_round_and_the_lowest_host_time(bench):
    rounds = [dict(model='m', train_ms=20.0, train_img_s=100.0, train_ms_all=[20.0],
                   train_peak_gib=1.0, train_host_ms=9.0, train_ops=7, infer_ms=4.0,
                   infer_img_s=500.0, infer_host_ms=3.0),
              dict(model='m', train_ms=10.0, train_img_s=200.0, train_ms_all=[10.0],
                   train_peak_gib=1.5, train_host_ms=12.0, train_ops=7, infer_ms=5.0,
                   infer_img_s=400.0, infer_host_ms=2.0)]
    best = common.best_of_rounds(rounds)
    assert (best['train_ms'], best['train_img_s'], best['train_peak_gib']) == (10.0, 200.0, 1.5)
    assert (best['infer_ms'], best['infer_img_s']) == (4.0, 500.0)  # another round
    assert best['train_host_ms'] == 9.0 and best['infer_host_ms'] == 2.0
    assert best['train_ms_rounds'] == [20.0, 10.0]
    assert best['train_host_ms_rounds'] == [9.0, 12.0]
    assert best['train_ops'] == 7 and best['rounds'] == 2
    assert rounds[0]['train_ms'] == 20.0  # the inputs are left as they were
    failed = common.best_of_rounds([rounds[0], dict(model='m', error='OOM')])
    assert failed['error'] == 'OOM'


def test_rounds_take_turns_between_models(bench, monkeypatch):
    order = []

    def fake_measure(model, size, batch, *args):
        order.append(model.name)
        return dict(infer_ms=float(len(order)), infer_img_s=batch * 1e3 / len(order))

    def fake_build(spec, size):
        model = torch.nn.Linear(1, 1)
        model.name = spec['name']
        return model

    monkeypatch.setattr(models_mode, 'measure_model', fake_measure)
    monkeypatch.setattr(models_mode, 'build_model', fake_build)
    specs = {'base': dict(name='base', type='X'), 'a': dict(name='a', type='X')}
    rows = models_mode.run_models(specs, sizes=[32], batches=[2], device=torch.device('cpu'),
                            amp=None, modes=['infer'], warmup=0, repeats=1, iters=1,
                            baseline='base', rounds=3)
    assert order == ['base', 'a'] * 3
    by_name = {r['model']: r for r in rows}
    assert by_name['base']['infer_ms_rounds'] == [1.0, 3.0, 5.0]
    assert by_name['a']['infer_ms'] == 2.0  # its best round, the first
    assert by_name['a']['infer_vs_baseline'] == pytest.approx(1.0 / 2.0)
    with pytest.raises(ValueError, match='rounds must be >= 1'):
        models_mode.run_models(specs, sizes=[32], batches=[2], device=torch.device('cpu'),
                         amp=None, modes=['infer'], warmup=0, repeats=1, iters=1,
                         rounds=0)


def test_dino_step_rounds_take_turns_and_keep_the_best(bench, monkeypatch):
    order = []

    def fake_step(config, device, warmup, repeats, iters, host_batch, **kwargs):
        order.append(config)
        n = len(order)
        return dict(batch=4, s_iter=0.1 * n, img_s=40.0 / n, peak_gib=float(n),
                    host_ms=10.0 / n, launches=3)

    monkeypatch.setattr(dino_step, 'measure_dino_step', fake_step)
    rows = dino_step.run_dino_steps({'base': 'b.py', 'a': 'a.py'}, torch.device('cpu'),
                                0, 1, 1, baseline='base', rounds=2)
    assert order == ['b.py', 'a.py', 'b.py', 'a.py']
    base, a = rows
    assert base['s_iter'] == pytest.approx(0.1) and base['peak_gib'] == 1.0
    assert base['s_iter_rounds'] == pytest.approx([0.1, 0.3])
    assert a['host_ms'] == pytest.approx(10.0 / 4)  # the lowest, from the last round
    assert a['img_s_vs_baseline'] == pytest.approx((40.0 / 2) / 40.0)


def test_host_mode_counts_the_fused_path_on_the_cpu(bench):
    """The host mode runs DinoVim's fused path on CPU tensors with the kernels
    skipped: the one-call stack and the module loop launch the same kernels (10 a
    block: 4 forward, 6 backward, a scan backward of one chunk), the stack issues
    fewer torch operators, and the dry run ends with the measurement."""
    from mmdinomamba.ops import spec
    specs = {'stack': dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=3)),
             'loop': dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=3),
                          stack_runner='loop')}
    rows = host_mode.run_host(specs, baseline='loop', rounds=2, width=32, warmup=1,
                          repeats=2, iters=1)
    stack, loop = rows
    assert stack['launches'] == loop['launches'] == 3 * 10
    assert stack['ops'] < loop['ops'] and stack['host_ms'] > 0
    assert len(stack['host_ms_rounds']) == 2 and loop['host_vs_baseline'] == 1.0
    assert spec.dry_run() is None
    assert 'stack' in host_mode.format_host_table(rows, 'loop')
    # under autocast (as on the GPU) the fused path's casts of weights and
    # gradients are counted too; float32 (the default) has none
    [bf16] = host_mode.measure_host(specs['stack'], width=32, warmup=1, repeats=1, iters=1,
                                amp=torch.bfloat16)
    assert bf16['launches'] == stack['launches'] and bf16['ops'] > stack['ops']
    with pytest.raises(ValueError, match='DinoVim'):
        host_mode.measure_host(dict(type='LinearViT', arch='base'))
    args = bench.parse_args(['host', '--models', 'dinovim-t', '--rounds', '1'])
    assert args.models == ['dinovim-tiny'] and args.baseline == 'dinovim-base-loop'
    assert args.amp is None  # main() reads it as 'none' in host mode, else 'bf16'
    data = bench.main(['--device', 'cpu', '--warmup', '1', '--repeats', '1', '--iters',
                      '1', 'host', '--models', 'dinovim-t', '--rounds', '1',
                      '--width', '64'])
    assert data['settings']['amp'] == 'none' and data['rows'][0]['launches'] == 240


def test_host_mode_launches_through_tritons_own_path_when_asked(bench):
    """``--launch triton``: the same kernels launched through Triton's own path (its
    driver and compiled kernels stood in for), in turns with the package's launcher
    on one model: the same launches and operators, more Python per launch; Triton's
    caches, driver and the fast-launch setting are as before afterwards."""
    pytest.importorskip('triton')
    import os

    from triton.runtime import driver

    from mmdinomamba.ops.triton import launch
    from mmdinomamba.ops.triton.conv import _conv_fwd_kernel
    spec = dict(type='DinoVim', arch=dict(embed_dims=32, num_layers=2))
    env = os.environ.get('MMDINOMAMBA_TRITON_FAST_LAUNCH')
    active = driver._active
    fast, triton = host_mode.measure_host(spec, width=32, warmup=1, repeats=2, iters=1,
                                      launches=('fast', 'triton'))
    assert (fast['launch'], triton['launch']) == ('fast', 'triton')
    assert fast['launches'] == triton['launches'] == 2 * 10
    assert fast['ops'] == triton['ops'] and fast['pycalls'] < triton['pycalls']
    assert len(triton['host_ms_all']) == 2 and triton['host_ms_min'] > 0
    assert os.environ.get('MMDINOMAMBA_TRITON_FAST_LAUNCH') == env
    assert driver._active is active
    assert all(not cache for cache, *_ in _conv_fwd_kernel.device_caches.values())
    launch.reread_environment()
    with pytest.raises(ValueError, match='launches must be some of'):
        host_mode.measure_host(spec, launches=('slow', ))


def test_dino_configs_come_from_the_checkout_or_the_command_line(bench, tmp_path):
    """The named DINO configs are files of ``configs/dino`` beside ``benchmarks/``
    (found from the script's place in the checkout, not from the installed
    package), or of ``dino-step --config-dir``."""
    repo = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    assert osp.samefile(names.CONFIG_DIR, osp.join(repo, 'configs', 'dino'))
    for name in names.DINO_CONFIGS.values():
        assert osp.isfile(osp.join(names.CONFIG_DIR, name)), name
    assert bench.parse_args(['dino-step']).config_dir == names.CONFIG_DIR
    data = bench.main(['--device', 'cpu', '--warmup', '0', '--repeats', '1',
                       '--iters', '1', 'dino-step', '--models', 'dinovim-t',
                       '--no-baseline', '--host-batch', '0', '--config-dir',
                       str(tmp_path)])
    (row, ) = data['rows']
    expected = osp.join(str(tmp_path), names.DINO_CONFIGS['dinovim-tiny'])
    assert row['config'] == expected and expected in row['error']


TINY_MLLA = dict(type='MLLA', arch=dict(embed_dims=8, depths=[1, 1, 1, 1],
                                        num_heads=[1, 1, 1, 1], mlp_ratio=2.0))
TINY_SWIN = dict(type='Swin', arch=dict(embed_dims=16, depths=[1, 1, 1, 1],
                                        num_heads=[1, 1, 2, 2]), window_size=2)


def test_model_names_come_from_the_zoo(bench):
    """Every mode names models as mmdinomamba.zoo does: each zoo backbone is a
    name of the table with the zoo's config, the rest are the zoo names' variants
    (slow twins, run modes) and the external baselines; the zoo's aliases and the
    baselines' resolve, suffix kept; each name's preset exists."""
    from mmpretrain.models import SwinTransformer

    from mmdinomamba import zoo
    from mmdinomamba.models.backbones import MLLA, DinoVim, LinearViT
    table = common.model_table()
    for name, (cfg, _, _) in zoo.BACKBONES.items():
        assert table[name] == dict(cfg, type=cfg['type'].replace(
            'VisionTransformer', 'ViT')), name
    suffixes = {s for v in names.VARIANTS.values() for s in v}
    for name, spec in table.items():
        if name in zoo.BACKBONES or name in common.BASELINES:
            continue
        base = next(name[:-len(s)] for s in suffixes if name.endswith(s))
        assert base in zoo.BACKBONES, name
        extra = {k: v for k, v in spec.items() if k not in table[base]}
        assert extra in names.VARIANTS[spec['type']].values(), name
    assert set(names.DINO_CONFIGS) <= set(table)
    assert set(names.CLS_CONFIGS) <= set(table)
    assert names.BASELINE in names.DINO_CONFIGS and names.BASELINE in names.CLS_CONFIGS
    for short, name in [('mlla-t', 'mlla-tiny'), ('mlla-s', 'mlla-small'),
                        ('mlla-b', 'mlla-base'), ('vit-b', 'vit-base'),
                        ('swin-t', 'swin-tiny'), ('reg-b', 'dinomamba-reg-base'),
                        ('dinovim-b-loop', 'dinovim-base-loop'),
                        ('mlla-t-rope-per-call', 'mlla-tiny-rope-per-call'),
                        ('mlla-b-graphed', 'mlla-base-graphed')]:
        assert common.model_name(short) == name and common.model_name(name) == name
    assert common.model_name('no-such-net') == 'no-such-net'
    zoos = dict(MLLA=MLLA.arch_zoo, DinoVim=DinoVim.arch_zoo,
                LinearViT=LinearViT.arch_zoo, Swin=SwinTransformer.arch_zoo)
    for name, spec in table.items():
        assert spec['type'] in common.MODEL_TYPES, name
        if spec['type'] in zoos:
            assert spec['arch'] in zoos[spec['type']], name
    args = bench.parse_args(['models', '--models', 'mlla-t', 'swin-tiny', 'dinovim-b',
                             '--baseline', 'vit-b'])
    assert args.models == ['mlla-tiny', 'swin-tiny', 'dinovim-base']
    assert args.baseline == 'vit-base'
    assert bench.parse_args(['dino-step', '--models', 'reg-b']).models == [
        'dinomamba-reg-base']
    assert bench.parse_args(['profile', '--model', 'mlla-b']).model == 'mlla-base'
    for argv in (['models', '--models', 'mlla-x'], ['host', '--models', 'vit-b'],
                 ['dino-step', '--models', 'mlla-t']):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)


def test_the_rope_per_call_variant_switches_the_stages_off(bench):
    """The slow twin is the stages' own switch (share_rope_table), not a patched
    method: on in the plain preset, off in '-rope-per-call'."""
    plain = common.build_model(dict(TINY_MLLA), 64)
    slow = common.build_model(dict(TINY_MLLA, rope_tables='per-call'), 64)
    assert all(s.share_rope_table for s in plain.layers)
    assert not any(s.share_rope_table for s in slow.layers)
    assert all('rope_table' not in vars(s) for s in slow.layers)  # no instance patch


@pytest.mark.slow
def test_models_mode_measures_mlla_and_swin_under_bf16(bench):
    """MLLA and mmpretrain's Swin beside the baseline at two sizes under CPU bf16
    autocast, inference and training step; the RoPE table built in every mixer
    call (the slow twin) issues more torch operators than one per stage, by the
    same count at every size (the count does not depend on the grid). Two blocks
    in the first stages: with one a stage, one table per stage is one per call."""
    mlla = dict(TINY_MLLA, arch=dict(TINY_MLLA['arch'], depths=[2, 2, 1, 1]))
    specs = {'base': TINY_LINEAR, 'mlla': mlla,
             'mlla-per-call': dict(mlla, rope_tables='per-call'),
             'swin': TINY_SWIN}
    rows = models_mode.run_models(specs, sizes=[64, 128], batches=[2, 1],
                            device=torch.device('cpu'), amp=torch.bfloat16,
                            modes=['infer', 'train'], warmup=1, repeats=1, iters=1,
                            baseline='base')
    by_key = {(r['model'], r['img_size']): r for r in rows}
    for r in rows:
        assert 'error' not in r, r
        assert r['infer_img_s'] > 0 and r['train_img_s'] > 0
        assert r['train_vs_baseline'] == pytest.approx(
            r['train_img_s'] / by_key['base', r['img_size']]['train_img_s'])
    assert by_key['swin', 64]['source'] == 'mmpretrain.SwinTransformer'
    extra = {size: {mode: by_key['mlla-per-call', size][f'{mode}_ops']
                    - by_key['mlla', size][f'{mode}_ops'] for mode in ('infer', 'train')}
             for size in (64, 128)}
    assert extra[64] == extra[128] and min(extra[64].values()) > 0
    with pytest.raises(ValueError, match="rope_tables must be None or 'per-call'"):
        common.build_model(dict(TINY_MLLA, rope_tables='cached'), 64)


@pytest.mark.slow
def test_models_mode_steps_a_compiled_mlla(bench):
    """The benchmark's bf16 steps on an MLLA under torch.compile (aot_eager: the
    forward and backward traced as Inductor gets them, without its slow CPU code
    generation)."""
    torch._dynamo.reset()
    model = common.build_model(TINY_MLLA, 64)
    model.compile(backend='aot_eager', dynamic=False)
    res = models_mode.measure_model(model, 64, 2, torch.device('cpu'), torch.bfloat16,
                              ['infer', 'train'], warmup=1, repeats=1, iters=1)
    assert res['infer_img_s'] > 0 and res['train_img_s'] > 0
    assert model._compiled_call_impl is not None


@pytest.mark.slow
def test_compile_scope_blocks_compiles_each_block_and_keeps_the_numbers(bench):
    """Regional compilation: exactly the blocks (the children of the innermost
    ModuleLists: each MLLA stage's ``blocks``) are compiled, the stages and the
    rest of the model not, and the model computes what it computed eagerly
    (aot_eager traces forward and backward without changing the arithmetic, so
    float32 agrees to rounding)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = common.build_model(dict(TINY_MLLA, drop_path_rate=0.0), 64).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = model(x)[-1]
    blocks = [b for stage in model.layers for b in stage.blocks]
    for b in blocks:
        b.compile(backend='aot_eager', dynamic=False)
    compiled = {id(m) for m in model.modules()
                if getattr(m, '_compiled_call_impl', None) is not None}
    assert compiled == {id(b) for b in blocks}
    with torch.no_grad():
        got = model(x)[-1]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_compile_model_picks_the_innermost_block_lists(bench, monkeypatch):
    """``compile_model(scope='blocks')`` compiles the children of each
    ModuleList holding no other ModuleList: Swin's and MLLA's stages' blocks, not
    the stages; ``'model'`` the whole model; an unknown scope or a model without a
    block list is a named error."""
    calls = []
    monkeypatch.setattr(torch.nn.Module, 'compile',
                        lambda self, **kw: calls.append((self, kw)))
    model = common.build_model(TINY_MLLA, 64)
    models_mode.compile_model(model, 'default', 'blocks')
    assert [m for m, _ in calls] == [b for stage in model.layers for b in stage.blocks]
    assert all(kw == dict(mode='default', dynamic=False) for _, kw in calls)
    calls.clear()
    models_mode.compile_model(model, 'max-autotune', 'model')
    assert calls == [(model, dict(mode='max-autotune', dynamic=False))]
    with pytest.raises(ValueError, match="compile scope must be one of"):
        models_mode.compile_model(model, 'default', 'stages')
    with pytest.raises(ValueError, match='no block list'):
        models_mode.compile_model(torch.nn.Linear(2, 2), 'default', 'blocks')


def test_models_mode_writes_each_row_as_it_comes(bench, tmp_path, monkeypatch):
    """With --out, the rows measured so far are on disk (``partial``) before the
    next model starts, so a run cut short keeps them."""
    out = tmp_path / 'bench.json'
    on_disk = []

    def fake_measure(model, size, batch, *args):
        on_disk.append(json.loads(out.read_text()) if out.exists() else None)
        return dict(infer_ms=1.0, infer_img_s=batch * 1e3)

    monkeypatch.setattr(models_mode, 'measure_model', fake_measure)
    monkeypatch.setitem(common.model_table(), 'tiny-a', TINY)
    monkeypatch.setitem(common.model_table(), 'tiny-b', TINY_LINEAR)
    data = bench.main(['--device', 'cpu', '--out', str(out), 'models', '--models',
                       'tiny-b', '--baseline', 'tiny-a', '--sizes', '32',
                       '--batch-sizes', '2', '--modes', 'infer'])
    assert on_disk[0] is None
    assert on_disk[1]['partial'] and [r['model'] for r in on_disk[1]['rows']] == [
        'tiny-a']
    final = json.loads(out.read_text())
    assert 'partial' not in final and [r['model'] for r in final['rows']] == [
        'tiny-a', 'tiny-b']
    assert data['settings']['baseline'] == 'tiny-a'


FAKE_OFFICIAL = '''
import torch.nn as nn


class MLLA(nn.Module):
    """Stands in for the official models/mlla.py: its constructor's keywords."""

    def __init__(self, img_size=224, patch_size=4, in_chans=3, num_classes=1000,
                 embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24),
                 mlp_ratio=4., drop_path_rate=0.1, **kwargs):
        super().__init__()
        self.args = dict(img_size=img_size, num_classes=num_classes,
                         embed_dim=embed_dim, depths=list(depths),
                         num_heads=list(num_heads), mlp_ratio=mlp_ratio)
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, patch_size)

    def forward(self, x):
        return self.proj(x).mean(dim=(2, 3))
'''


def test_official_mlla_rows_come_from_the_given_file(bench, tmp_path):
    """``--official-mlla PATH``: every mlla-* model gets an '-official' row built
    from PATH in its arch, without a classifier, measured in the same call; a
    missing file or one without an MLLA class is named."""
    path = tmp_path / 'mlla.py'
    path.write_text(FAKE_OFFICIAL)
    model = common.build_model(dict(type='OfficialMLLA', arch='tiny', path=str(path)), 64)
    assert model.args == dict(img_size=64, num_classes=0, embed_dim=64,
                              depths=[2, 4, 8, 4], num_heads=[2, 4, 8, 16],
                              mlp_ratio=4.0)
    data = bench.main(['--device', 'cpu', '--warmup', '0', '--repeats', '1', '--iters',
                       '1', 'models', '--models', 'mlla-t', '--official-mlla',
                       str(path), '--sizes', '32', '--batch-sizes', '1', '--modes',
                       'infer', '--no-baseline'])
    rows = {r['model']: r for r in data['rows']}
    assert set(rows) == {'mlla-tiny', 'mlla-tiny-official'}
    assert all('error' not in r and r['infer_img_s'] > 0 for r in rows.values())
    assert rows['mlla-tiny-official']['source'].startswith('official MLLA')
    assert data['settings']['official_mlla'] == str(path)
    with pytest.raises(FileNotFoundError, match="not a file; give the path"):
        common.build_official_mlla(str(tmp_path / 'none.py'), 'tiny', 64)
    (tmp_path / 'other.py').write_text('x = 1\n')
    with pytest.raises(ValueError, match='defines no MLLA class'):
        common.build_official_mlla(str(tmp_path / 'other.py'), 'tiny', 64)


def test_host_mode_counts_mllas_fused_path(bench):
    """MLLA in the host mode: per block, the features and the output kernels and
    the two add + LayerNorms, each forward and backward (8 launches); the graphed
    preset runs the same on the CPU."""
    arch = dict(embed_dims=16, depths=[1, 2, 1, 1], num_heads=[1, 2, 4, 8],
                mlp_ratio=2.0)
    for spec in (dict(type='MLLA', arch=arch),
                 dict(type='MLLA', arch=arch, stage_graphs=True)):
        [row] = host_mode.measure_host(spec, warmup=1, repeats=1, iters=1)
        assert row['launches'] == 8 * 5 and row['ops'] > 0
