"""Calibration helpers: the activation observer, SmoothQuant factors and
percentile clipping, against hand-computed values and float64 torch."""

from __future__ import annotations

import pytest
import torch

from opforge.ops.quant import quantize
from opforge.quant import (
    ActivationObserver,
    apply_smoothing,
    percentile_clip,
    percentile_threshold,
    smooth_factors,
)

I8, E4 = torch.int8, torch.float8_e4m3fn

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]


def rand(shape, gen, scale=1.0):
    return torch.randn(shape, generator=gen, dtype=torch.float64).mul(scale).float()


def test_observer_running_absmax(gen):
    obs = ActivationObserver()
    batches = [rand((5, 8), gen), rand((2, 3, 8), gen, 4.0), rand((7, 8), gen)]
    for b in batches:
        assert obs.observe(b) is b
    expect = torch.cat([b.reshape(-1, 8) for b in batches]).abs().amax(0)
    assert torch.equal(obs.absmax, expect) and obs.batches == 3
    obs.reset()
    assert obs.absmax is None and obs.batches == 0


def test_observer_ignores_non_finite_and_checks_channels():
    obs = ActivationObserver()
    obs.observe(torch.tensor([[1.0, float("nan"), -3.0], [float("inf"), 2.0, 0.5]]))
    assert obs.absmax.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="batch has 4 channels, earlier batches had 3"):
        obs.observe(torch.ones(2, 4))
    with pytest.raises(TypeError, match="floating-point"):
        obs.observe(torch.ones(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="no batch observed"):
        ActivationObserver().scale()


def test_observer_scale_equals_dynamic_scale(gen):
    x = rand((16, 32), gen, 3.0)
    obs = ActivationObserver()
    obs.observe(x[:8])
    obs.observe(x[8:])
    for dtype in (I8, E4):
        s = obs.scale(dtype)
        assert s.shape == () and torch.equal(s, quantize(x, dtype).scale)
        static = quantize(x, dtype, scale=s)
        assert torch.equal(static.data.view(torch.uint8), quantize(x, dtype).data.view(torch.uint8))
    sc = obs.scale(I8, "channel")
    assert sc.shape == (1, 32) and torch.equal(sc, quantize(x, I8, "channel").scale)


def test_observer_hook_on_linear(gen):
    lin = torch.nn.Linear(8, 4)
    obs = ActivationObserver()
    handle = obs.hook(lin)
    x = rand((3, 8), gen, 2.0)
    lin(x)
    handle.remove()
    lin(x * 10)
    assert torch.equal(obs.absmax, x.abs().amax(0)) and obs.batches == 1


def test_smooth_factors_formula_and_invariance(gen):
    w = rand((6, 8), gen)
    act = rand((32, 8), gen)
    act[:, 3] *= 50  # an outlier channel
    amax = act.abs().amax(0)
    s = smooth_factors(amax, w, alpha=0.5)
    expect = (amax.double().sqrt() / w.double().abs().amax(0).sqrt())
    assert torch.allclose(s.double(), expect, rtol=1e-6)
    # x / s @ (w * s).T == x @ w.T
    y = (act.double() / s.double()) @ apply_smoothing(w, s).double().T
    assert torch.allclose(y, act.double() @ w.double().T, rtol=1e-5, atol=1e-5)
    # The activation's channel ranges are flatter after smoothing.
    flat = (act / s).abs().amax(0)
    assert flat.max() / flat.min() < amax.max() / amax.min()


def test_smooth_factors_alpha_edges_and_zero_channels(gen):
    w = rand((4, 5), gen)
    a = rand((5,), gen).abs() + 0.1
    a[2] = 0.0
    w[:, 4] = 0.0
    s1 = smooth_factors(a, w, alpha=1.0)
    assert torch.allclose(s1[[0, 1, 3]], a[[0, 1, 3]])
    s0 = smooth_factors(a, w, alpha=0.0)
    assert torch.allclose(s0[[0, 1, 3]], 1.0 / w.abs().amax(0)[[0, 1, 3]])
    assert s1[2] == 1.0 and s1[4] == 1.0
    with pytest.raises(ValueError, match="act_absmax must be 1-D with 5 values"):
        smooth_factors(a[:4], w)
    with pytest.raises(ValueError, match="alpha must be in"):
        smooth_factors(a, w, alpha=1.5)
    with pytest.raises(ValueError, match="weight must be 2-D"):
        smooth_factors(a, w[0])


def test_percentile_threshold_and_clip():
    x = torch.arange(1, 10001, dtype=torch.float32)
    x[::2] *= -1
    assert percentile_threshold(x, 99.99).item() == 9999.0
    assert percentile_threshold(x, 50).item() == 5000.0
    assert percentile_threshold(x, 100).item() == 10000.0
    c = percentile_clip(x, 99.0)
    assert c.abs().max().item() == 9900.0 and c.dtype == x.dtype
    assert torch.equal(c[:9000], x[:9000])
    with pytest.raises(ValueError, match="q must be in"):
        percentile_threshold(x, 0)


def test_percentile_clip_lowers_bulk_error(gen):
    x = rand((64, 256), gen)
    x[0, 0] = 1000.0  # one outlier sets the per-tensor scale
    bulk = (slice(1, None), slice(None))

    def err(t):
        q = quantize(t, I8)
        return (q.data.float() * q.scale - x)[bulk].abs().mean()

    assert err(percentile_clip(x, 99.9)) < err(x) / 10
