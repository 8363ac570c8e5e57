"""MLLA's switches outside the mixer (block design, expansion, CPE, APE, Swin's stem
and downsampling), each against its definition written out here."""
import pytest
import torch
import torch.nn.functional as F

from mmdinomamba.models.backbones import MLLA, MLLABlock
from mmdinomamba.models.backbones.mlla import PatchStem, SwinPatchMerging
from mmdinomamba.models.mixers.positional import grid_conv
from tests.factories import mlla_arch

DIM, HEADS, HW = 8, 2, (3, 4)
TINY = mlla_arch(embed_dims=8, num_heads=[1, 1, 2, 2])


def perturbed_block(seed=0, **kwargs):
    torch.manual_seed(seed)
    block = MLLABlock(DIM, HEADS, mlp_ratio=2.0, **kwargs).double()
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return block.eval()


def tokens(seed=1, hw=HW):
    torch.manual_seed(seed)
    return torch.randn(2, hw[0] * hw[1], DIM, dtype=torch.float64)


def mlp(block, x):
    return block.mlp.fc2(F.gelu(block.mlp.fc1(x)))


def test_transformer_design_is_a_pre_norm_block():
    block = perturbed_block(design='transformer', cpe=False)
    x = tokens()
    y = x + block.out_proj(block.attn(block.norm1(x), HW))
    y = y + mlp(block, block.norm2(y))
    torch.testing.assert_close(block(x, HW), y)
    assert not hasattr(block, 'in_proj') and block.cpe1 is None and block.cpe2 is None


@pytest.mark.parametrize('expand', [1, 2])
def test_all_design_is_the_gated_sub_block_without_mlp(expand):
    """E C channels inside (E times the heads, same head width), no second
    sub-block; CPE only before the one sub-block."""
    block = perturbed_block(design='all', expand=expand)
    x = tokens()
    assert block.mlp is None and block.norm2 is None and block.cpe2 is None
    assert block.attn.dim == expand * DIM and block.attn.num_heads == expand * HEADS
    x1 = x + grid_conv(block.cpe1, x, HW)
    u = F.layer_norm(x1, (DIM, ), block.norm1.weight, block.norm1.bias)
    gate = F.silu(u @ block.act_proj.weight.T + block.act_proj.bias)
    a = F.silu(grid_conv(block.dwc, u @ block.in_proj.weight.T + block.in_proj.bias, HW))
    y = x1 + (block.attn(a, HW) * gate) @ block.out_proj.weight.T + block.out_proj.bias
    torch.testing.assert_close(block(x, HW), y)


def test_sub_design_without_cpe_drops_both_convolutions():
    with_cpe, without = perturbed_block(), perturbed_block(cpe=False)
    extra = {n for n, _ in with_cpe.named_parameters()} - \
        {n for n, _ in without.named_parameters()}
    assert extra == {'cpe1.weight', 'cpe1.bias', 'cpe2.weight', 'cpe2.bias'}
    x = tokens()
    y = x + without._mix(without.norm1(x), HW)
    y = y + mlp(without, without.norm2(y))
    torch.testing.assert_close(without(x, HW), y)


def test_ape_is_added_to_the_block_input_and_resized_for_other_grids():
    block = perturbed_block(design='transformer', cpe=False, ape_grid=(4, 4))
    plain = perturbed_block(design='transformer', cpe=False)
    state = {k: v for k, v in block.state_dict().items() if k != 'absolute_pos_embed'}
    plain.load_state_dict(state)
    assert block.absolute_pos_embed.shape == (1, 16, DIM)
    x = tokens(hw=(4, 4))
    torch.testing.assert_close(block(x, (4, 4)), plain(x + block.absolute_pos_embed,
                                                      (4, 4)))
    # another grid: the table resized bicubically (the project's resize_pos_embed)
    from mmdinomamba.models.backbones import resize_pos_embed
    x = tokens(hw=(2, 6))
    table = resize_pos_embed(block.absolute_pos_embed, (4, 4), (2, 6))
    torch.testing.assert_close(block(x, (2, 6)), plain(x + table, (2, 6)))


def test_patch_stem_is_linear_on_4x4_patches_then_layer_norm():
    torch.manual_seed(0)
    stem = PatchStem(3, DIM).double()
    x = torch.randn(2, 3, 10, 7, dtype=torch.float64)  # padded to 12 x 8
    out, hw = stem(x)
    assert hw == (3, 2) and out.shape == (2, 6, DIM)
    padded = F.pad(x, (0, 1, 0, 2))
    w = stem.proj.weight.flatten(1)
    for n in range(6):
        r, s = divmod(n, 2)
        patch = padded[:, :, 4 * r:4 * r + 4, 4 * s:4 * s + 4].flatten(1)
        want = F.layer_norm(patch @ w.T + stem.proj.bias, (DIM, ), stem.norm.weight,
                            stem.norm.bias)
        torch.testing.assert_close(out[:, n], want)


def test_swin_patch_merging_concatenates_2x2_neighbourhoods():
    torch.manual_seed(0)
    merge = SwinPatchMerging(DIM).double()
    with torch.no_grad():
        merge.norm.weight.add_(torch.randn(4 * DIM, dtype=torch.float64))
    x = tokens(hw=(3, 5))  # odd: padded to 4 x 6
    out, hw = merge(x, (3, 5))
    assert hw == (2, 3) and out.shape == (2, 6, 2 * DIM)
    grid = torch.zeros(2, 4, 6, DIM, dtype=torch.float64)
    grid[:, :3, :5] = x.reshape(2, 3, 5, DIM)
    for n in range(6):
        r, s = divmod(n, 3)
        cat = torch.cat([grid[:, 2 * r, 2 * s], grid[:, 2 * r + 1, 2 * s],
                         grid[:, 2 * r, 2 * s + 1], grid[:, 2 * r + 1, 2 * s + 1]], -1)
        want = F.layer_norm(cat, (4 * DIM, ), merge.norm.weight, merge.norm.bias) \
            @ merge.reduction.weight.T
        torch.testing.assert_close(out[:, n], want)


@pytest.mark.parametrize('design, expand', [('transformer', 1), ('all', 2), ('sub', 1)])
def test_swin_layout_runs_any_size_and_trains(design, expand):
    model = MLLA(arch=TINY, stem='patch', downsample='merging', block_design=design,
                 expand=expand, cpe=False, ape=True, img_size=64,
                 mixer_cfg=dict(rope=False, lepe=False, value_proj=True),
                 out_indices=(0, 1, 2, 3))
    grids = [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert [m.blocks[0].ape_grid for m in model.layers] == grids
    outs = model(torch.randn(2, 3, 50, 70))  # 13 x 18 -> 7 x 9 -> 4 x 5 -> 2 x 3
    assert [tuple(o.shape) for o in outs] == [(2, 8, 13, 18), (2, 16, 7, 9),
                                              (2, 32, 4, 5), (2, 64, 2, 3)]
    sum(o.square().mean() for o in outs).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in model.parameters())
    # the analysis API reaches every block's mixer on its own grid
    inter = model.forward_intermediates(torch.randn(1, 3, 32, 32), mixer_inputs=True)
    assert inter.mixer_inputs[0].shape[-1] == expand * 8
    assert inter.layout_of(3).hw == (1, 1)


def test_bad_choices_are_named():
    with pytest.raises(ValueError, match=r"unknown block design 'mamba'.*'sub', 'all'"):
        MLLA(arch=TINY, block_design='mamba')
    with pytest.raises(ValueError, match=r"unknown stem 'vit'"):
        MLLA(arch=TINY, stem='vit')
    with pytest.raises(ValueError, match=r"unknown downsample 'pool'"):
        MLLA(arch=TINY, downsample='pool')
    with pytest.raises(ValueError, match=r"expand must be .* 1 for the 'transformer'"):
        MLLA(arch=TINY, block_design='transformer', expand=2)
