"""The quantize / dequantize contract: QuantizedTensor layout (what a GEMM
consumes), torch.library registration (opcheck), torch.compile, error
messages, registry variants and dispatch decisions, no autograd.

Oracles are torch in float64 or hand-computed values, never opforge itself.
"""

from __future__ import annotations

import pytest
import torch

from opforge.ops import quant as Q
from opforge.ops.quant import QuantizedTensor, dequantize, quantize
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

I8, E4, E5 = torch.int8, torch.float8_e4m3fn, torch.float8_e5m2
F32, BF16 = torch.float32, torch.bfloat16
OPS = torch.ops.opforge

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]


def rand(shape, gen, dtype=F32, scale=2.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


# ---------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------
def test_registered_with_all_variants():
    q = registry.get("quantize")
    assert [v.name for v in q.variants] == ["triton_static", "triton_fused", "triton_stats", "torch_eager",
                                            "reference"]
    d = registry.get("opforge::dequantize")
    assert [v.name for v in d.variants] == ["triton_apply", "torch_eager", "reference"]
    for op in (q, d):
        assert op.variant("torch_eager").kind == "vendor" and op.variant("torch_eager").devices == ("cuda",)
        assert op.variant("reference").kind == "reference"
        assert all(v.version for v in op.variants)


def test_samples_reach_every_triton_variant():
    op = registry.get("quantize")
    samples = op.samples(torch.device("cpu"))
    reached = {dispatch.decide(op, a, tune=False).variant.name for a in samples}
    assert {"triton_static", "triton_fused", "triton_stats"} <= reached
    assert {a[1] for a in samples} == {I8, E4, E5}
    assert {a[0].dtype for a in samples} >= {F32, BF16, torch.float16}
    assert registry.get("dequantize").samples(torch.device("cpu"))


@pytest.mark.parametrize("args,expected", [
    (((64, 256), I8, "token", [], -1, True), "triton_fused"),
    (((64, 256), E4, "block", [128, 128], -1, True), "triton_fused"),
    (((64, 256), I8, "tensor", [], -1, True), "triton_stats"),
    (((64, 256), I8, "channel", [], -1, False), "triton_stats"),
    (((4, 40000), E4, "token", [], -1, True), "triton_stats"),
    (((512, 256), E4, "block", [256, 128], -1, True), "reference"),  # a block over one program's limit
])
def test_dispatch_decisions(args, expected, gen):
    shape, *rest = args
    d = dispatch.explain("quantize", rand(shape, gen), *rest)
    assert d.variant.name == expected, str(d)


def test_dispatch_static_and_memo_key(gen):
    x = rand((8, 32), gen)
    s = torch.full((8, 1), 0.01)
    d = dispatch.explain("quantize", x, I8, "token", [], -1, True, s)
    assert d.variant.name == "triton_static"
    assert "no scale given" in str(dispatch.explain("quantize", x, I8, "token", [], -1, True))
    key = Q.QUANTIZE.memo_key
    base = key(x, I8, "token", [], -1, True)
    assert base != key(x, E4, "token", [], -1, True)
    assert base != key(x, I8, "token", [], -1, False)
    assert base != key(x, I8, "token", [], -1, True, s)
    assert base != key(x.t().contiguous().t(), I8, "token", [], -1, True)


# ---------------------------------------------------------------------------
# QuantizedTensor: shapes a GEMM can consume directly
# ---------------------------------------------------------------------------
def test_layouts(gen):
    x = rand((6, 10), gen, BF16)
    t = quantize(x, I8, "token")
    assert isinstance(t, QuantizedTensor) and t.scale.shape == (6, 1) and t.zero_point is None
    assert t.data.dtype == I8 and t.data.shape == (6, 10) and t.data.is_contiguous() and t.symmetric
    assert quantize(x, I8, "channel").scale.shape == (1, 10)
    c0 = quantize(x, E4, "channel", axis=0)
    assert c0.scale.shape == (6, 1) and c0.axis == 0
    b = quantize(x, E5, "block", block=(4, 4))
    assert b.scale.shape == (2, 3) and b.block == (4, 4)
    assert quantize(x, I8).scale.shape == () and quantize(x, I8).granularity == "tensor"
    a = quantize(x, I8, "token", symmetric=False)
    assert a.zero_point.dtype == torch.int32 and a.zero_point.shape == (6, 1) and not a.symmetric
    assert quantize(rand((2, 3, 5), gen), I8, "token").scale.shape == (2, 3, 1)
    assert quantize(rand((2, 3, 5), gen), I8, "channel", axis=1).scale.shape == (1, 3, 1)
    assert quantize(torch.ones(2, 256), E4, "block").block == (128, 128)
    for t in (t, c0, b, a):
        assert t.scale.dtype == F32
    assert dequantize(t).dtype == BF16 and t.dequantize(F32).dtype == F32


@pytest.mark.parametrize("granularity,kw", [("tensor", {}), ("token", {}), ("channel", {"axis": 0}),
                                            ("block", {"block": (8, 8)})])
def test_gemm_contract(granularity, kw, gen):
    # x @ w.T from (q.data, q.scale) alone: the scales broadcast against the data.
    x = rand((16, 32), gen)
    q = quantize(x, I8, granularity, **kw)
    s = q.scale
    if granularity == "block":
        s = s.repeat_interleave(8, 0).repeat_interleave(8, 1)
    assert torch.allclose(q.data.double() * s.double(), x.double(), atol=float(q.scale.max()) * 0.51)


def test_static_equals_dynamic_with_its_own_scale(gen):
    x = rand((12, 48), gen, BF16)
    dyn = quantize(x, I8, "token", symmetric=False)
    static = quantize(x, I8, "token", symmetric=False, scale=dyn.scale, zero_point=dyn.zero_point)
    assert torch.equal(static.data, dyn.data) and torch.equal(static.scale, dyn.scale)
    assert static.scale is not dyn.scale


def test_not_differentiable(gen):
    x = rand((4, 16), gen).requires_grad_()
    q = quantize(x, E4, "token")
    assert not q.data.requires_grad and not q.scale.requires_grad


# ---------------------------------------------------------------------------
# Error messages
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("call,exc,match", [
    (lambda x: quantize(x, torch.float16), TypeError, "dtype must be one of"),
    (lambda x: quantize(x.to(torch.int32), I8), TypeError, "floating-point"),
    (lambda x: quantize([1.0], I8), TypeError, "must be a torch.Tensor"),
    (lambda x: quantize(x, I8, "row"), ValueError, "granularity must be one of"),
    (lambda x: quantize(x, E4, symmetric=False), ValueError, "asymmetric quantization is int8 only"),
    (lambda x: quantize(x, I8, "channel", axis=2), ValueError, "axis 2 is out of range"),
    (lambda x: quantize(x, I8, "block", block=(0, 4)), ValueError, "block sizes must be positive"),
    (lambda x: quantize(x, I8, "block", block=(4,)), TypeError, "block must be a pair"),
    (lambda x: quantize(x, I8, "block", block=128), TypeError, "block must be a pair"),
    (lambda x: quantize(x, I8, "token", scale=[1.0]), TypeError, "scale must be a torch.Tensor"),
    (lambda x: quantize(x, I8, "token", symmetric=False, scale=torch.ones(8, 1), zero_point=3), TypeError,
     "zero_point must be a torch.Tensor"),
    (lambda x: quantize(x.reshape(2, 4, 4), I8, "block"), ValueError, "needs a 2-D tensor"),
    (lambda x: quantize(x, I8, "token", block=(4, 4)), ValueError, "only for granularity 'block'"),
    (lambda x: quantize(x, I8, "token", scale=torch.ones(8)), ValueError, r"needs \(8, 1\)"),
    (lambda x: quantize(x, I8, "token", scale=torch.ones(8, 1, dtype=torch.float64)), TypeError,
     "scale must be torch.float32"),
    (lambda x: quantize(x, I8, "block", block=(4, 4), scale=torch.ones(2, 2)), ValueError, r"needs \(2, 1\)"),
    (lambda x: quantize(x, I8, "token", symmetric=False, scale=torch.ones(8, 1)), ValueError, "needs zero_point"),
    (lambda x: quantize(x, I8, "token", scale=torch.ones(8, 1), zero_point=torch.zeros(8, 1, dtype=torch.int32)),
     ValueError, "symmetric=True"),
    (lambda x: quantize(torch.tensor(1.0), I8, "token"), ValueError, "at least 1 dim"),
    (lambda x: dequantize(x), TypeError, "expected a QuantizedTensor"),
    (lambda x: dequantize(quantize(x, I8, "token"), torch.int8), TypeError, "dtype must be float16"),
])
def test_errors(call, exc, match, gen):
    x = rand((8, 4), gen)
    with pytest.raises(exc, match=match) as info:
        call(x)
    assert "opforge.quantize" in str(info.value) or "opforge.dequantize" in str(info.value)


def test_dequantize_rejects_mismatched_scale(gen):
    q = quantize(rand((8, 4), gen), I8, "token")
    bad = QuantizedTensor(q.data, torch.ones(4, 1), None, "token", dtype=F32)
    with pytest.raises(ValueError, match=r"opforge.dequantize: scale has shape \(4, 1\)"):
        dequantize(bad)
    fp8 = quantize(rand((8, 4), gen), E4, "token")
    with pytest.raises(ValueError, match="zero_point is int8 only"):
        dequantize(QuantizedTensor(fp8.data, fp8.scale, torch.zeros(8, 1, dtype=torch.int32), "token"))


# ---------------------------------------------------------------------------
# torch.library: opcheck and torch.compile
# ---------------------------------------------------------------------------
def test_opcheck_quantize(gen):
    x = rand((6, 16), gen)
    s = torch.full((6, 1), 0.02)
    z = torch.zeros((6, 1), dtype=torch.int32)
    for args in ((x, I8, "token", [], -1, True, None, None),
                 (x, E4, "block", [4, 8], -1, True, None, None),
                 (x, I8, "tensor", [], -1, False, None, None),
                 (x, I8, "token", [], -1, False, s, z)):
        result = torch.library.opcheck(OPS.quantize.default, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_dequantize(gen):
    q = quantize(rand((6, 16), gen), I8, "channel", axis=0, symmetric=False)
    for args in ((q.data, q.scale, q.zero_point, "channel", [], 0, BF16),
                 (q.data, q.scale, None, "channel", [], 0, F32)):
        result = torch.library.opcheck(OPS.dequantize.default, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_torch_compile_fullgraph(gen):
    x = rand((8, 32), gen, BF16)

    def fn(t):
        q = quantize(t, E4, "block", block=(4, 16))
        return dequantize(q, F32), q.scale

    y, s = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
    y0, s0 = fn(x)
    assert torch.equal(y, y0) and torch.equal(s, s0)


def test_reference_variant_matches_triton(gen):
    x = rand((10, 24), gen, BF16)
    with force_variant("quantize", "reference"):
        ref = quantize(x, I8, "channel", symmetric=False)
    q = quantize(x, I8, "channel", symmetric=False)
    assert torch.equal(q.data, ref.data) and torch.equal(q.scale, ref.scale)
    assert torch.equal(q.zero_point, ref.zero_point)
