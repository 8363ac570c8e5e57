"""Upstream analysis on our configs and models."""
import torch
from mmengine.analysis import get_model_complexity_info

from mmdinomamba.models.backbones import DinoVim


def test_mmengine_complexity_counter_traces_dinovim():
    """mmengine's counter traces the model (``torch.jit.trace``), where a tensor's
    size is a tensor: the automatic SSD chunk of DinoVim's mixer is an int all the
    same (it was ``ssd: chunk_size must be a positive int, got tensor(66)``)."""
    model = DinoVim(arch=dict(embed_dims=32, num_layers=2), img_size=64, patch_size=8,
                    mixer_cfg=dict(d_state=16, headdim=16)).eval()
    result = get_model_complexity_info(model, input_shape=(3, 64, 64))
    assert result['params'] == sum(p.numel() for p in model.parameters())
    # at least the two in_proj / out_proj products of each block, per token
    tokens = 64 + 2
    in_proj = model.layers[0].mixer.in_proj
    out_proj = model.layers[0].mixer.out_proj
    per_block = tokens * (in_proj.in_features * in_proj.out_features
                          + out_proj.in_features * out_proj.out_features)
    assert result['flops'] >= 2 * per_block
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 64, 64))[0]).all()
