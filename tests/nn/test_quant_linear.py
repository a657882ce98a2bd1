"""``opforge.nn.QuantLinear`` and ``quantize_linears`` under the Triton
interpreter: W8A8 int8 / fp8 error against ``nn.Linear`` (float64), the
exact product of the quantized operands, dynamic and static activation
scales, SmoothQuant on outlier channels, state_dict round trips, in-place
swapping, torch.compile and error messages.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from helpers import INTERPRETER_WARNINGS

from opforge.bench.case import rel_err
from opforge.nn.linear import Linear as FusedLinear
from opforge.nn.quant_linear import QuantLinear, quantize_linears
from opforge.ops.quant import quantize_reference
from opforge.quant.calibration import ActivationObserver

I8, E4M3 = torch.int8, torch.float8_e4m3fn
BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64

pytestmark = INTERPRETER_WARNINGS


def make_linear(K, N, gen, bias=True, dtype=F32):
    lin = nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn((N, K), generator=gen) / K ** 0.5)
        if bias:
            lin.bias.copy_(torch.randn(N, generator=gen) * 0.1)
    return lin.to(dtype)


def full(lin: nn.Linear, x):
    """The float64 nn.Linear (without converting the module)."""
    b = lin.bias.to(F64) if lin.bias is not None else None
    return torch.nn.functional.linear(x.to(F64), lin.weight.detach().to(F64), b)


def exact(lin: QuantLinear, x):
    """float64 product of the operands the module quantizes (the bit-exact
    quantize reference for x, the module's own weight buffers)."""
    x2 = x.reshape(-1, lin.in_features).to(F32)
    if lin.smooth is not None:
        x2 = x2 * lin.smooth
    if lin.input_scale is not None:
        q, s, _ = quantize_reference(x2, lin.qdtype, "tensor", scale=lin.input_scale)
    else:
        q, s, _ = quantize_reference(x2, lin.qdtype, "token")
    y = (q.to(F64) * s.to(F64)) @ (lin.weight.to(F64) * lin.weight_scale.to(F64).t()).t()
    if lin.bias is not None:
        y = y + lin.bias.to(F64)
    return y.reshape(tuple(x.shape[:-1]) + (lin.out_features,))


@pytest.mark.parametrize("dtype,bound", [(I8, 2e-2), (E4M3, 6e-2)], ids=["int8", "fp8"])
def test_w8a8_error_against_nn_linear(dtype, bound, gen):
    lin = make_linear(64, 48, gen)
    x = torch.randn((3, 5, 64), generator=gen)
    q = QuantLinear.from_linear(lin, dtype)
    y = q(x)
    assert y.shape == (3, 5, 48) and y.dtype == F32
    assert rel_err(y, full(lin, x)) <= bound
    assert rel_err(y, exact(q, x)) <= 1e-5  # the GEMM itself is exact up to fp32 rounding
    assert q.weight.dtype == dtype and q.weight_scale.shape == (1, 48)


def test_bf16_module_activation_and_no_bias(gen):
    lin = make_linear(32, 24, gen, bias=False, dtype=BF16)
    fused = FusedLinear.from_linear(lin, activation="gelu")
    q = QuantLinear.from_linear(fused)  # the fused Linear's activation carries over
    assert q.activation == "gelu" and q.bias is None
    x = torch.randn((7, 32), generator=gen).to(BF16)
    y = q(x)
    assert y.dtype == BF16
    want = torch.nn.functional.gelu(exact(q, x))
    assert rel_err(y, want) <= 1e-2
    assert rel_err(y, torch.nn.functional.gelu(x.double() @ lin.weight.double().t())) <= 3e-2
    q32 = QuantLinear.from_linear(lin, out_dtype=F32, activation="relu")
    assert q32(x).dtype == F32 and (q32(x) >= 0).all()


def test_static_calibration(gen):
    lin = make_linear(48, 32, gen)
    batches = [torch.randn((16, 48), generator=gen) for _ in range(3)]
    q = QuantLinear.from_linear(lin, I8, activation_scale="static", calibration=batches)
    amax = torch.cat(batches).abs().amax()
    assert torch.allclose(q.input_scale, amax / 127, rtol=1e-6)
    obs = ActivationObserver()
    for b in batches:
        obs.observe(b)
    q2 = QuantLinear.from_linear(lin, I8, activation_scale="static", calibration=obs)
    x = torch.randn((10, 48), generator=gen)
    assert torch.equal(q(x), q2(x))
    assert rel_err(q(x), exact(q, x)) <= 1e-5
    assert rel_err(q(x), full(lin, x)) <= 3e-2
    dyn = QuantLinear.from_linear(lin, I8)
    assert not torch.equal(dyn(x), q(x))  # the static scale is used


@pytest.mark.parametrize("scale_mode", ["dynamic", "static"])
def test_smoothing_reduces_error_on_outlier_channels(scale_mode, gen):
    lin = make_linear(64, 40, gen)
    x = torch.randn((64, 64), generator=gen)
    x[:, 3] *= 60.0
    x[:, 17] *= 40.0
    want = full(lin, x)
    plain = QuantLinear.from_linear(lin, I8, activation_scale=scale_mode, calibration=[x])
    smooth = QuantLinear.from_linear(lin, I8, activation_scale=scale_mode, calibration=[x], smoothing_alpha=0.5)
    e_plain, e_smooth = rel_err(plain(x), want), rel_err(smooth(x), want)
    assert e_smooth < 0.6 * e_plain, (e_smooth, e_plain)
    assert rel_err(smooth(x), exact(smooth, x)) <= 1e-5


def test_state_dict_round_trip(gen):
    lin = make_linear(32, 16, gen)
    x = torch.randn((4, 32), generator=gen)
    q = QuantLinear.from_linear(lin, E4M3, activation_scale="static", calibration=[x], smoothing_alpha=0.5)
    sd = q.state_dict()
    assert set(sd) == {"weight", "weight_scale", "bias", "input_scale", "smooth"}
    assert sd["weight"].dtype == E4M3 and sd["input_scale"].shape == ()
    shell = QuantLinear(32, 16, dtype=E4M3, activation_scale="static", smoothing=True)
    shell.load_state_dict(sd)
    assert torch.equal(shell(x), q(x))
    h = QuantLinear.from_linear(lin, E4M3).half()  # dtype casts leave the quantized state alone
    assert h.weight.dtype == E4M3 and h.weight_scale.dtype == F32 and h.bias.dtype == F32
    assert h(x.half()).dtype == torch.float16
    plain = QuantLinear(32, 16)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        plain.load_state_dict(sd)
    assert "dtype=float8_e4m3fn" in repr(q) and "activation_scale='static'" in repr(q) and "smoothing=True" in repr(q)


def test_quantize_linears_swaps_in_place(gen):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(),
                          nn.Sequential(FusedLinear(48, 40, activation="silu"), nn.Linear(40, 16)))
    x = torch.randn((6, 32), generator=gen)
    with torch.no_grad():
        want = model.double()(x.double())
    model = model.float()
    calib = [torch.randn((8, 32), generator=gen) for _ in range(2)] + [x]
    out = quantize_linears(model, I8, calibration=calib, activation_scale="static",
                           filter=lambda name, m: name != "2.1")
    assert out is model
    assert isinstance(model[0], QuantLinear) and isinstance(model[2][0], QuantLinear)
    assert isinstance(model[2][1], nn.Linear) and not isinstance(model[2][1], QuantLinear)
    assert model[2][0].activation == "silu" and model[0].input_scale is not None
    assert rel_err(model(x), want) <= 5e-2
    with pytest.raises(TypeError, match="cannot be swapped in place"):
        quantize_linears(nn.Linear(4, 4))
    dyn = quantize_linears(nn.Sequential(nn.Linear(16, 8)), E4M3)
    assert isinstance(dyn[0], QuantLinear) and dyn[0].input_scale is None


def test_compile_fullgraph(gen):
    q = QuantLinear.from_linear(make_linear(32, 16, gen), I8)
    x = torch.randn((2, 3, 32), generator=gen)
    out = torch.compile(q, fullgraph=True, backend="eager")(x)
    assert torch.equal(out, q(x))


def test_clear_errors(gen):
    lin = make_linear(16, 8, gen)
    with pytest.raises(TypeError, match="expected a torch.nn.Linear"):
        QuantLinear.from_linear(nn.Conv1d(2, 2, 1))
    with pytest.raises(TypeError, match="dtype must be torch.int8 or torch.float8_e4m3fn"):
        QuantLinear.from_linear(lin, torch.float8_e5m2)
    with pytest.raises(ValueError, match="need calibration data"):
        QuantLinear.from_linear(lin, activation_scale="static")
    with pytest.raises(ValueError, match="activation_scale must be"):
        QuantLinear.from_linear(lin, activation_scale="percentile")
    with pytest.raises(ValueError, match="smoothing_alpha must be"):
        QuantLinear.from_linear(lin, calibration=[torch.randn(2, 16)], smoothing_alpha=1.5)
    with pytest.raises(ValueError, match="calibration has 12 channels"):
        QuantLinear.from_linear(lin, activation_scale="static", calibration=[torch.randn(2, 12)])
    with pytest.raises(ValueError, match="activation must be None"):
        QuantLinear.from_linear(lin, activation="tanh")
    q = QuantLinear.from_linear(lin)
    with pytest.raises(ValueError, match="in_features=16"):
        q(torch.randn(4, 15))
    with pytest.raises(TypeError, match="input must be a float16"):
        q(torch.ones(4, 16, dtype=torch.int64))
