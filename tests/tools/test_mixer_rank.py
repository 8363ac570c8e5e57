"""tools/analysis/mixer_rank.py end to end on toy images, for the three mixers."""
import csv
import json
import os.path as osp

import pytest
from PIL import Image

REPO = osp.join(osp.dirname(__file__), '..', '..')


@pytest.fixture(scope='module')
def tool(load_tool):
    return load_tool('tools/analysis/mixer_rank.py')


@pytest.mark.parametrize('config,kind,keys', [
    ('dinovim-mini_p16_128px.py', 'ssd', {'forward', 'backward', 'combined'}),
    ('linearvit-mini_p16_128px.py', 'linear', {'attention'}),
    ('vit-mini_p16_128px.py', 'softmax', {'attention'}),
])
def test_tool_writes_table_and_plots(tmp_path, capsys, config, kind, keys, tool):
    out = tmp_path / 'rank'
    paths = tool.main([
        osp.join(REPO, 'configs', 'analysis', config), '--toy', '--num-images', '2',
        '--img-size', '64', '--layers', '0', '-1', '--chunk', '8', '--out-dir',
        str(out), '--device', 'cpu', '--no-progress'])
    assert sorted(paths) == ['heads_csv', 'json', 'rank_png', 'spectra_png',
                             'summary_csv', 'table']
    data = json.load(open(paths['json']))
    assert data['meta']['layers'] == [0, 3] and data['meta']['chunk'] == 8
    assert {s['key'] for s in data['summary']} == keys
    assert {s['kind'] for s in data['summary']} == {kind}
    assert all(s['within_bounds'] for s in data['summary'])
    with open(paths['summary_csv']) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * len(keys)
    if kind == 'linear':  # non-causal linear attention: global rank <= D_QK = 16
        assert all(int(r['rank_max']) <= 16 for r in rows)
    else:  # softmax and SSD: full rank for the 16 patches + readout tokens
        assert all(int(r['rank_min']) == int(r['seqlen']) for r in rows)
    for key in ('spectra_png', 'rank_png'):
        with Image.open(paths[key]) as image:
            assert image.format == 'PNG'
    printed = capsys.readouterr().out
    assert open(paths['table']).read().strip() in printed


def test_tool_needs_an_image_source(tmp_path, tool):
    with pytest.raises(SystemExit):
        tool.main([osp.join(REPO, 'configs', 'analysis',
                                   'linearvit-mini_p16_128px.py'),
                          '--out-dir', str(tmp_path)])


def test_tool_refuses_a_checkpoint_that_does_not_cover_the_backbone(tmp_path, tool):
    """A checkpoint with only the embeddings (a ViT's names and shapes) fails
    naming the missing keys; --no-strict runs, keeping the random blocks."""
    import torch
    from mmengine.config import Config

    from mmdinomamba.analysis.loading import load_backbone
    config = osp.join(REPO, 'configs', 'analysis', 'dinovim-mini_p16_128px.py')
    state = load_backbone(Config.fromfile(config)).state_dict()
    path = str(tmp_path / 'embeddings.pth')
    torch.save({k: v for k, v in state.items()
                if not k.startswith(('layers.', 'norm_f'))}, path)
    args = [config, path, '--toy', '--num-images', '1', '--img-size', '32',
            '--layers', '0', '--chunk', '8', '--device', 'cpu', '--no-progress',
            '--out-dir', str(tmp_path / 'out')]
    with pytest.raises(ValueError, match=r'missing keys .*layers\.0\.mixer\.in_proj'):
        tool.main(args)
    assert not (tmp_path / 'out').exists()
    assert 'json' in tool.main(args + ['--no-strict'])
