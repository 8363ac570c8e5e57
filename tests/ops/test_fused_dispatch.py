"""Dispatch between the PyTorch reference and the Triton kernels (CPU side)."""
import pytest
import torch

from mmdinomamba.ops import (add_layer_norm, add_rms_norm, resolve_backend, rms_norm,
                             ssd_scan, use_triton)


def test_cpu_takes_reference_paths():
    assert not use_triton(torch.zeros(2))
    assert resolve_backend('auto', torch.device('cpu')) == 'chunked'
    with pytest.raises(ValueError, match='triton'):
        resolve_backend('triton', torch.device('cpu'))


def test_triton_backend_refuses_states():
    with pytest.raises(ValueError, match='initial_states'):
        resolve_backend('triton', torch.device('cuda'), needs_states=True)


@pytest.mark.parametrize('with_residual', [False, True])
def test_add_rms_norm_reference_path(with_residual):
    """The CPU path is the plain definition: stream = h + residual (fp32), then RMSNorm."""
    torch.manual_seed(0)
    h = torch.randn(2, 5, 8).bfloat16()
    res = torch.randn(2, 5, 8, dtype=torch.float32) if with_residual else None
    w = torch.randn(8)
    stream, normed = add_rms_norm(h, res, w, 1e-5)
    expected = h.float() + res if with_residual else h.float()
    assert stream.dtype == torch.float32
    torch.testing.assert_close(stream, expected)
    # independent definition of RMSNorm, in float64
    e64 = expected.double()
    ref = e64 / torch.sqrt(e64.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    torch.testing.assert_close(normed.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(normed, rms_norm(expected, w, 1e-5))


def test_add_rms_norm_scale_is_per_sample():
    """The stochastic-depth factor multiplies each sample's h, in float32."""
    torch.manual_seed(0)
    h = torch.randn(3, 5, 8).bfloat16()
    res = torch.randn(3, 5, 8)
    scale = torch.tensor([0., 1 / 0.9, 1.])
    stream, _ = add_rms_norm(h, res, torch.ones(8), 1e-5, scale)
    torch.testing.assert_close(stream[0], res[0], rtol=0, atol=0)  # dropped
    torch.testing.assert_close(stream[1], h[1].float() / 0.9 + res[1])
    torch.testing.assert_close(stream[2], h[2].float() + res[2], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r'scale must have shape \(3,\)'):
        add_rms_norm(h, res, torch.ones(8), 1e-5, torch.ones(5))


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_add_layer_norm_reference_path(dtype):
    """The CPU path: residual = x + h, then ``F.layer_norm`` (the same bits in
    float32), which is the closed form (r - mean) / sqrt(var + eps) * w + b."""
    torch.manual_seed(0)
    x, h = torch.randn(2, 5, 24, dtype=dtype), torch.randn(2, 5, 24, dtype=dtype)
    w, b = torch.randn(24, dtype=dtype), torch.randn(24, dtype=dtype)
    res, out = add_layer_norm(x, h, w, b, 1e-5)
    assert res.dtype == out.dtype == dtype
    assert torch.equal(res, x + h)
    assert torch.equal(out, torch.nn.functional.layer_norm(x + h, (24, ), w, b, 1e-5))
    r = (x + h).double()
    mu = r.mean(-1, keepdim=True)
    closed = (r - mu) / torch.sqrt((r - mu).pow(2).mean(-1, keepdim=True) + 1e-5)
    # float32 rounding: a few units of 2^-24 of outputs of order 1
    torch.testing.assert_close(out.double(), closed * w.double() + b.double(),
                               rtol=1e-5, atol=1e-6)
    res, out = add_layer_norm(x, None, w, b, 1e-5)  # no add: the residual is x
    assert res is x and torch.equal(out, add_layer_norm(x, torch.zeros_like(x), w, b)[1])
    with pytest.raises(ValueError, match=r'h must have the shape of x \(2, 5, 24\)'):
        add_layer_norm(x, h[:, :4], w, b)


def test_add_layer_norm_output_dtype_follows_autocast():
    """Under autocast the normalised rows come out in its dtype (the next matmul's
    input), the residual in the dtype of x + h; without, both in the residual's."""
    torch.manual_seed(0)
    x, h = torch.randn(3, 16), torch.randn(3, 16).bfloat16()
    w, b = torch.randn(16), torch.randn(16)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        res, out = add_layer_norm(x, h, w, b)
    assert res.dtype == torch.float32 and out.dtype == torch.bfloat16
    want = torch.nn.functional.layer_norm(x + h.float(), (16, ), w, b)
    assert torch.equal(out, want.bfloat16())
    assert add_layer_norm(x, h, w, b)[1].dtype == torch.float32


def test_ssd_rejects_nonfinite_dt_on_cpu():
    x = torch.randn(1, 4, 2, 4)
    dt = torch.rand(1, 4, 2)
    dt[0, 1, 0] = float('nan')
    B = torch.randn(1, 4, 1, 4)
    with pytest.raises(ValueError, match='NaN or Inf'):
        ssd_scan(x, dt, -torch.ones(2), B, B.clone())


def test_fast_paths_have_their_twins_signatures():
    """Every Triton entry point takes exactly the arguments of its PyTorch twin."""
    import inspect
    pytest.importorskip('triton')
    from mmdinomamba.ops import mixer_core_ref, ssd_ref
    from mmdinomamba.ops.triton import mixer_core_triton, ssd_triton

    def params(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]

    assert params(ssd_triton) == params(ssd_ref)
    assert params(mixer_core_triton) == params(mixer_core_ref)
    from mmdinomamba.ops import add_layer_norm_ref
    from mmdinomamba.ops.triton import add_layer_norm_triton
    assert params(add_layer_norm_triton) == params(add_layer_norm_ref)


def test_mixer_forward_is_the_core_on_the_projection():
    """SSDMixer.forward has one body: ``mixer_core(in_proj(u), core_params(), spec)``."""
    from mmdinomamba.models.mixers import SSDMixer
    from mmdinomamba.ops import mixer_core_ref
    torch.manual_seed(0)
    mixer = SSDMixer(32, d_state=16, headdim=16, chunk_size=16).double()
    u = torch.randn(2, 19, 32, dtype=torch.float64)
    want = mixer_core_ref(mixer.in_proj(u), mixer.core_params(), mixer.spec)
    assert torch.equal(mixer(u), want)
    assert mixer.spec.nheads == mixer.nheads and mixer.spec.conv_dim == mixer.conv_dim


def test_skip_kernels_is_one_switch_for_the_dry_run():
    """Inside ``skip_kernels`` the fused path is taken on the CPU, every launch is
    counted and none runs, and the finiteness checks are off (the numbers are
    garbage); outside, everything is as before. One block at a time."""
    pytest.importorskip('triton')
    from mmdinomamba.models.mixers import SSDMixer
    from mmdinomamba.ops import check_finite, mixer_core, skip_kernels, uses_fused_core
    from mmdinomamba.ops.spec import dry_run
    torch.manual_seed(0)
    mixer = SSDMixer(32, d_state=16, headdim=16)
    zxbcdt = mixer.in_proj(torch.randn(2, 9, 32)).detach()
    nan = torch.full((2, ), float('nan'))
    assert not uses_fused_core(zxbcdt, mixer.spec)
    with skip_kernels() as dry:
        assert dry_run() is dry and use_triton(zxbcdt)
        assert uses_fused_core(zxbcdt, mixer.spec)
        assert resolve_backend('auto', torch.device('cpu')) == 'triton'
        check_finite(nan, 'x')  # no error: a dry run's numbers are garbage
        with torch.no_grad():
            out = mixer_core(zxbcdt, mixer.core_params(), mixer.spec)
        # the fused forward: both directions' conv, their scans, their gated norms
        assert dry.launches == 3 and out.shape == (2, 9, 32)
        with pytest.raises(RuntimeError, match='already inside'):
            with skip_kernels():
                pass
    assert dry_run() is None and not use_triton(zxbcdt)
    assert resolve_backend('auto', torch.device('cpu')) == 'chunked'
    with pytest.raises(ValueError, match='NaN or Inf'):
        check_finite(nan, 'x')


def test_one_chunk_size_default_and_one_check():
    """Every scan, the mixer, its spec and DinoVim's mixer default to CHUNK_SIZE;
    the scan and the mixer refuse a bad value with the same check."""
    import inspect

    from mmdinomamba.models import DinoVim, SSDMixer
    from mmdinomamba.ops import (CHUNK_SIZE, MixerSpec, check_chunk_size, ssd_chunked,
                                 ssd_quadratic, ssd_ref)
    for fn in (ssd_scan, ssd_chunked, ssd_quadratic, ssd_ref, SSDMixer):
        assert inspect.signature(fn).parameters['chunk_size'].default == CHUNK_SIZE, fn
    assert MixerSpec._field_defaults['chunk_size'] == CHUNK_SIZE
    assert DinoVim.default_mixer_cfg['chunk_size'] == CHUNK_SIZE
    for good in ('auto', 1, 64):
        check_chunk_size(good)
    x, dt = torch.randn(1, 4, 2, 4), torch.rand(1, 4, 2)
    B = torch.randn(1, 4, 1, 4)
    for bad in (0, -1, 2.5, True, 'big', None):
        with pytest.raises(ValueError, match="ssd: chunk_size must be a positive int"):
            ssd_scan(x, dt, -torch.ones(2), B, B.clone(), chunk_size=bad)
        with pytest.raises(ValueError, match="SSDMixer: chunk_size must be"):
            SSDMixer(16, d_state=4, headdim=8, chunk_size=bad)


def test_auto_chunk_is_resolved_by_the_scan():
    """chunk_size='auto' scans in auto_chunk_size(seqlen) tokens: the same numbers
    as that int, bit for bit, on both sides of the 128-token switch."""
    from mmdinomamba.ops import auto_chunk_size, ssd_chunked
    torch.manual_seed(0)
    for seqlen in (50, 150):
        x, dt = torch.randn(1, seqlen, 2, 4), torch.rand(1, seqlen, 2)
        B, C = torch.randn(1, seqlen, 1, 4), torch.randn(1, seqlen, 1, 4)
        want = ssd_chunked(x, dt, -torch.ones(2), B, C,
                           chunk_size=auto_chunk_size(seqlen))
        assert torch.equal(ssd_scan(x, dt, -torch.ones(2), B, C), want)
        assert torch.equal(ssd_chunked(x, dt, -torch.ones(2), B, C), want)


def test_fused_path_notes_an_explicit_chunk_once(monkeypatch):
    """The fused core cannot honour an explicit chunk_size: it says so once per
    process and path (a UserWarning), never for the default; the PyTorch path
    honours it and says nothing."""
    import warnings

    import mmdinomamba.ops.spec as spec
    from mmdinomamba.models.mixers import SSDMixer
    from mmdinomamba.ops import mixer_core, skip_kernels
    pytest.importorskip('triton')
    monkeypatch.setattr(spec, '_CHUNK_NOTES', set())
    torch.manual_seed(0)

    def notes(mixer, fused=True):
        zxbcdt = mixer.in_proj(torch.randn(2, 9, 32)).detach()
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter('always')
            if fused:
                with skip_kernels():  # the fused path on the CPU, kernels skipped
                    mixer_core(zxbcdt, mixer.core_params(), mixer.spec)
            else:
                mixer_core(zxbcdt, mixer.core_params(), mixer.spec)
        return [str(w.message) for w in caught if 'chunk_size' in str(w.message)]

    explicit = SSDMixer(32, d_state=16, headdim=16, chunk_size=16)
    assert notes(explicit, fused=False) == []  # the PyTorch scan uses it
    assert notes(SSDMixer(32, d_state=16, headdim=16)) == []  # the default
    first = notes(explicit)
    assert len(first) == 1 and 'chunk_size=16 is not used' in first[0] \
        and 'fused Triton core' in first[0]
    assert notes(explicit) == [] and notes(SSDMixer(32, d_state=16, headdim=16,
                                                    chunk_size=8)) == []


def test_add_layer_norm_dry_run_is_one_launch_each_way():
    """In a dry run the add + LayerNorm takes the fused path on the CPU: one launch
    forward (with or without the add), one for the backward."""
    pytest.importorskip('triton')
    from mmdinomamba.ops import skip_kernels
    x = torch.randn(2, 9, 96, requires_grad=True)
    h, w, b = torch.randn(2, 9, 96), torch.ones(96, requires_grad=True), torch.zeros(96)
    with skip_kernels() as dry:
        with torch.no_grad():
            res, out = add_layer_norm(x, None, w, b)
        assert dry.launches == 1 and res is x and out.shape == x.shape
        res, out = add_layer_norm(x, h, w, b)
        assert dry.launches == 2 and res.shape == out.shape == x.shape
        out.sum().backward()
        assert dry.launches == 3 and x.grad.shape == x.shape and w.grad.shape == (96, )
