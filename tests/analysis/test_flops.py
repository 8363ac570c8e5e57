"""MAC counts (conv + matmul) against hand counts written out as formulas, the
official MLLA figures through tools/analysis/get_flops.py, and the guard against
uncounted matrix products."""
import os.path as osp

import pytest
import torch

from mmdinomamba.analysis.flops import (HANDLES, count_macs, model_complexity,
                                        tensor_forward)
from mmdinomamba.models import DinoVim, LinearAttentionMixer
from mmdinomamba.models.backbones import MLLA
from tests.factories import mlla_arch

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def ceil(a, b):
    return -(-a // b)


# ------------------------------------------------------------------ hand counts
def linear_attention_macs(n, dim, heads, qk_dim=None, value_proj=False, lepe=False,
                          input_gate=False):
    """One LinearAttentionMixer without the forget gate on n tokens: the q/k (and
    v) projections, K^T V and Q S (n d e per head), the normaliser Q . mean(K)
    (n d per head), LePE (9 per output), the input gate's two low-rank maps."""
    q = qk_dim or dim
    d, e = q // heads, dim // heads
    macs = n * dim * 2 * q + heads * (2 * n * d * e + n * d)
    macs += n * dim * dim if value_proj else 0
    macs += 9 * n * dim if lepe else 0
    macs += 2 * n * dim * ceil(dim, 16) if input_gate else 0
    return macs


def ssd_macs(seqlen, chunk, heads, n, p):
    """The chunked SSD scan (mmdinomamba.ops.ssd_chunked) per batch element, with
    c = ceil(L / Q) chunks of Q = min(chunk, L) tokens (padded): the intra-chunk
    C B^T and (L o C B^T) X (Q^2 (n + p) per chunk), the chunk states B^T X
    (Q n p per chunk), the recurrence over the c + 1 chunk boundaries
    ((c + 1)^2 n p) and the states' output C H (Q n p per chunk); per head."""
    q = min(chunk, seqlen)
    c = ceil(seqlen, q)
    return heads * (c * q * q * (n + p) + 2 * c * q * n * p + (c + 1) ** 2 * n * p)


def mlla_block_macs(n, c, heads, mlp_ratio, design='sub', expand=1, cpe=True,
                    mixer=None):
    mixer = dict(dict(rope=True, lepe=True), **(mixer or {}))
    macs = 2 * 9 * n * c if cpe and design != 'all' else (9 * n * c if cpe else 0)
    inner = expand * c
    if design != 'transformer':
        macs += 2 * n * c * inner + 9 * n * inner  # in_proj, act_proj, dwc
    macs += linear_attention_macs(n, inner, expand * heads, mixer.get('qk_dim'),
                                  mixer.get('value_proj', False), mixer['lepe'],
                                  mixer.get('input_gate', False))
    macs += n * inner * c  # out_proj
    if design != 'all':
        macs += 2 * n * c * int(mlp_ratio * c)
    return macs


def mlla_macs(arch, hw, num_classes=0, stem='conv', downsample='mbconv', **block):
    """A whole MLLA backbone (and a linear head) on an (H, W) input."""
    C, H, W = arch['embed_dims'], *hw
    if stem == 'conv':  # sides padded to multiples of 4, two stride-2 stages
        n1 = (ceil(H, 4) * 2) * (ceil(W, 4) * 2)
        n2 = ceil(H, 4) * ceil(W, 4)
        macs = n1 * (C // 2) * 3 * 9 + 2 * n1 * (C // 2) ** 2 * 9
        macs += n2 * 4 * C * (C // 2) * 9 + n2 * C * 4 * C
    else:  # 4x4 patches, linear
        macs = ceil(H, 4) * ceil(W, 4) * C * 3 * 16
    h, w = ceil(H, 4), ceil(W, 4)
    for i, depth in enumerate(arch['depths']):
        c = C * 2 ** i
        macs += depth * mlla_block_macs(h * w, c, arch['num_heads'][i],
                                        arch['mlp_ratio'], **block)
        if i < 3:
            hp, wp = h + h % 2, w + w % 2  # odd grids padded
            out = hp * wp // 4
            if downsample == 'mbconv':
                macs += hp * wp * 8 * c * c + out * 8 * c * 9 + out * 2 * c * 8 * c
            else:
                macs += out * 4 * c * 2 * c
            h, w = hp // 2, wp // 2
    return macs + 8 * C * num_classes


SMALL = mlla_arch(depths=[1, 2, 1, 1], num_heads=[1, 2, 2, 4])
SWIN = dict(stem='patch', downsample='merging', block_design='transformer', cpe=False,
            mixer_cfg=dict(rope=False, lepe=False, value_proj=True))


def count(model, *args):
    model.eval()
    return count_macs(lambda: model(*args))[0]


# ------------------------------------------------------------------------ tests
@pytest.mark.parametrize('hw', [(40, 40), (36, 52)], ids=['square', 'odd-grids'])
def test_mlla_equals_its_hand_count(hw):
    """MLLA's block (CPE, gate, RoPE, LePE), its stem and MBConv downsampling;
    36 x 52 px gives 9 x 13 tokens, odd grids padded before each downsampling.
    (Grids of one token are avoided: a product over a length-1 axis runs as a
    plain multiplication, which counts nothing.)"""
    model = MLLA(arch=SMALL, drop_path_rate=0.0)
    assert count(model, torch.randn(1, 3, *hw)) == mlla_macs(SMALL, hw)


@pytest.mark.parametrize('row', [
    dict(),
    dict(arch=dict(SMALL, num_heads=[1] * 4), mixer=dict(qk_dim=8)),
    dict(design='all', expand=2, mixer=dict(value_proj=False)),
    dict(design='sub', mixer=dict(value_proj=False)),
    dict(cpe=True, mixer=dict(lepe=True, input_gate=True)),
], ids=['baseline', 'single-head', 'block-all', 'block-sub', 'cpe-lepe-input-gate'])
def test_ablation_designs_equal_their_hand_counts(row):
    arch = row.get('arch', SMALL)
    mixer = dict(SWIN['mixer_cfg'], **row.get('mixer', {}))
    block = dict(design=row.get('design', 'transformer'), expand=row.get('expand', 1),
                 cpe=row.get('cpe', False))
    model = MLLA(arch=arch, stem='patch', downsample='merging', mixer_cfg=mixer,
                 block_design=block['design'], expand=block['expand'],
                 cpe=block['cpe'], drop_path_rate=0.0)
    want = mlla_macs(arch, (32, 40), stem='patch', downsample='merging', mixer=mixer,
                     **block)
    assert count(model, torch.randn(1, 3, 32, 40)) == want


def gla_macs(seqlen, chunk, heads, d, p):
    """The chunked forget-gate attention (mmdinomamba.ops.mlla) per batch element,
    with c = ceil(L / Q) chunks of Q = min(chunk, L) tokens (padded): within each
    chunk Q K^T and its product with V (Q^2 (d + p)), each chunk's end state
    K^T V (Q d p), the states carried across chunks (c^2 d p; with one chunk a
    product over a length-1 axis, which counts nothing) and their output (Q d p
    per chunk); per head. The same with a decay per channel (each row's keys
    decayed to it, then a product)."""
    q = min(chunk, seqlen)
    c = ceil(seqlen, q)
    across = c * c * d * p if c > 1 else 0
    return heads * (c * q * q * (d + p) + 2 * c * q * d * p + across)


@pytest.mark.parametrize('form,chunk', [(True, 64), ('channel', 16)])
@pytest.mark.parametrize('seqlen', [20, 150], ids=['one-chunk', 'three-chunks'])
def test_forget_gate_counts_its_chunks(seqlen, form, chunk):
    """Linear attention with the forget gate: the projections, the decay's
    projection (one per head, or one per key channel), and the chunked attention
    twice (numerator with p = e, normaliser with p = 1)."""
    dim, heads = 16, 2
    mixer = LinearAttentionMixer(dim, heads, forget_gate=form)
    hw = (10, seqlen // 10)
    d = e = dim // heads
    want = seqlen * dim * 2 * dim + seqlen * dim * (heads if form is True else dim)
    want += gla_macs(seqlen, chunk, heads, d, e) + gla_macs(seqlen, chunk, heads, d, 1)
    assert count(mixer, torch.randn(1, seqlen, dim), hw) == want


def test_dinovim_counts_both_scans():
    """DinoVim (bidirectional Mamba-2): per block in_proj, per direction the causal
    conv (4 per output) and the SSD scan (one chunk of L <= 128 tokens), out_proj;
    the patch embedding. L = 16 patches + 2 [CLS] slots."""
    dim, depth, d_state, headdim = 32, 2, 16, 16
    model = DinoVim(arch=dict(embed_dims=dim, num_layers=depth), img_size=64,
                    mixer_cfg=dict(d_state=d_state, headdim=headdim))
    d_inner = 2 * dim
    heads, conv_dim = d_inner // headdim, d_inner + 2 * d_state
    L = 16 + 2
    block = L * dim * (2 * d_inner + 2 * d_state + heads) + L * d_inner * dim
    block += 2 * (L * conv_dim * 4 + ssd_macs(L, L, heads, d_state, headdim))
    want = 16 * 3 * 16 * 16 * dim + depth * block
    assert count(model, torch.randn(1, 3, 64, 64)) == want


def test_softmax_attention_has_a_handle():
    """mmpretrain's ViT runs F.scaled_dot_product_attention, a fused CPU kernel the
    counter has no formula for: HANDLES gives Q K^T and P V, N^2 d each."""
    from mmpretrain.models import VisionTransformer
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu in HANDLES
    d, depth, ffn = 32, 2, 64
    model = VisionTransformer(arch=dict(embed_dims=d, num_layers=depth, num_heads=2,
                                        feedforward_channels=ffn), img_size=64)
    n = 16 + 1
    block = n * d * 3 * d + 2 * n * n * d + n * d * d + 2 * n * d * ffn
    assert count(model, torch.randn(1, 3, 64, 64)) == 16 * 3 * 256 * d + depth * block


def test_an_uncounted_matrix_product_is_named():
    """An operator that multiplies but has no formula raises, naming it."""
    counted = HANDLES.pop(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu)
    try:
        q = torch.randn(1, 2, 8, 4)
        with pytest.raises(RuntimeError, match='_scaled_dot_product_flash_attention'):
            count_macs(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    finally:
        HANDLES[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = counted


def test_what_is_counted_per_model_kind():
    from mmdinomamba.analysis.flops import build_model_from_config
    from mmengine.config import Config
    backbone = MLLA(arch=SMALL)
    assert tensor_forward(backbone, None)[1] == 'MLLA.forward'
    seg = Config.fromfile(osp.join(
        ROOT, 'configs', 'upernet', 'upernet_dinovim-tiny-p16_8xb2-160k_ade20k-512x512.py'))
    assert "forward(mode='tensor')" in tensor_forward(build_model_from_config(seg),
                                                      None)[1]
    det = Config.fromfile(osp.join(ROOT, 'configs', 'cascade_mask_rcnn',
                                   'cascade-mask-rcnn_dinovim-tiny-p16_fpn_1x_coco.py'))
    assert 'extract_feat' in tensor_forward(build_model_from_config(det), None)[1]
    with pytest.raises(ValueError, match=r'shape must be \(height, width\)'):
        model_complexity(backbone, (224, ))


@pytest.mark.parametrize('size, paper', [('tiny', 4.13), ('small', 7.25),
                                         ('base', 16.11)])
def test_official_mlla_gmacs_through_the_tool(size, paper, load_tool):
    """MLLA-T/S/B classifiers at 224 px against the official models' count
    (torch.utils.flop_counter / 2 of the official code, measured on the official models/mlla.py)."""
    tool = load_tool('tools/analysis/get_flops.py')
    result = tool.main([osp.join(ROOT, 'configs', 'mlla',
                                 f'mlla-{size}_32xb128-300e_in1k.py')])
    assert abs(result.macs / 1e9 / paper - 1) < 0.02
    arch = MLLA.arch_zoo[size]
    assert result.macs == mlla_macs(arch, (224, 224), num_classes=1000)
    assert result.shape == (1, 3, 224, 224) and set(result.parts) == {'backbone',
                                                                     'head'}


def test_tool_shape_and_cfg_options(load_tool, capsys):
    tool = load_tool('tools/analysis/get_flops.py')
    config = osp.join(ROOT, 'configs', 'mlla', 'ablation', 'linear-swin-t_in1k.py')
    options = ['model.backbone.arch.depths=[1,1,1,1]', 'model.head.num_classes=10']
    result = tool.main([config, '--shape', '64', '96', '--cfg-options', *options])
    arch = dict(embed_dims=96, depths=[1, 1, 1, 1], num_heads=[3, 6, 12, 24],
                mlp_ratio=4.0)
    assert result.macs == mlla_macs(arch, (64, 96), num_classes=10, stem='patch',
                                    downsample='merging', design='transformer',
                                    cpe=False, mixer=SWIN['mixer_cfg'])
    model = MLLA(arch=arch, **SWIN)
    assert result.params == sum(p.numel() for p in model.parameters()) + 768 * 10 + 10
    out = capsys.readouterr().out
    assert 'input:  1 x 3 x 64 x 96' in out
    assert f'MACs:   {result.macs:,} ({result.macs / 1e9:.2f} G' in out
