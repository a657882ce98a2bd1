"""Quantize / dequantize kernels under the Triton interpreter, bit for bit
against an independent oracle: numpy float32 arithmetic per group (one
correctly rounded operation a step, ``np.rint`` for half-to-even), written
without opforge's reference. Also hand-computed values for ties, NaN, inf
and fp8 subnormals, and a float64 round-trip bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opforge.kernels import quant as K
from opforge.ops import quant as Q
from opforge.runtime.dispatch import force_variant

I8, E4, E5 = torch.int8, torch.float8_e4m3fn, torch.float8_e5m2
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
QMAX = {I8: 127.0, E4: 448.0, E5: 57344.0}
TINY = np.float32(np.finfo(np.float32).tiny)

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]


# ---------------------------------------------------------------------------
# Independent oracle
# ---------------------------------------------------------------------------
def _labels(shape, granularity, block, axis):
    """Group id of every element and the scale shape."""
    idx = np.indices(shape) if shape else np.zeros((0,), dtype=np.int64)
    if granularity == "tensor":
        return np.zeros(shape, dtype=np.int64), ()
    if granularity == "token":
        lead = shape[:-1]
        return np.arange(math.prod(lead)).reshape(lead + (1,)) * np.ones(shape, dtype=np.int64), lead + (1,)
    if granularity == "channel":
        a = axis % len(shape)
        return idx[a], tuple(s if i == a else 1 for i, s in enumerate(shape))
    bm, bk = block
    nr, nc = -(-shape[0] // bm), -(-shape[1] // bk)
    return (idx[0] // bm) * nc + idx[1] // bk, (nr, nc)


def oracle(x, qdtype, granularity, block=None, axis=-1, symmetric=True, scale=None, zero_point=None):
    xs = x.detach().to(F32).numpy()
    shape = tuple(x.shape)
    lab, sshape = _labels(shape, granularity, block, axis)
    n_groups = math.prod(sshape)
    qmax = np.float32(QMAX[qdtype])
    scales = np.zeros(n_groups, dtype=np.float32)
    zps = np.zeros(n_groups, dtype=np.float32)
    out = np.zeros(shape, dtype=np.float32)
    for gid in range(n_groups):
        m = lab == gid
        vals = xs[m]
        if scale is None:
            fin = vals[np.isfinite(vals)]
            mx = np.float32(max(fin.max(initial=0.0), 0.0))
            mn = np.float32(min(fin.min(initial=0.0), 0.0))
            s = (max(mx, -mn) / qmax) if symmetric else (np.float32(mx - mn) / np.float32(255.0))
            s = np.float32(max(np.float32(s), TINY))
            inv = np.float32(1.0) / s
            zp = np.float32(np.clip(np.rint(-mn * inv) - np.float32(128.0), -128, 127))
        else:
            s = np.float32(scale.reshape(-1)[gid].item())
            inv = np.float32(1.0) / np.float32(max(s, TINY))
            zp = np.float32(zero_point.reshape(-1)[gid].item()) if zero_point is not None else np.float32(0)
        scales[gid], zps[gid] = s, zp
        v = (vals * inv).astype(np.float32)
        if qdtype == I8:
            r = np.rint(v)
            r = np.clip(r, -127, 127) if symmetric else np.clip(r + zp, -128, 127)
            out[m] = np.where(np.isnan(r), 0, r)
        else:
            out[m] = np.where(v > qmax, qmax, np.where(v < -qmax, -qmax, v))
    data = torch.from_numpy(out).to(qdtype) if qdtype != I8 else torch.from_numpy(out).to(torch.int8)
    zp_t = None if symmetric else torch.from_numpy(zps).to(torch.int32).reshape(sshape)
    return data, torch.from_numpy(scales).reshape(sshape), zp_t


def bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_same(q, ref):
    data, s, z = ref
    assert q.data.shape == data.shape and q.data.dtype == data.dtype
    assert torch.equal(bits(q.data), bits(data)), (q.data.float() - data.float()).abs().max()
    assert q.scale.shape == s.shape and q.scale.dtype == F32
    assert torch.equal(q.scale, s)
    if z is None:
        assert q.zero_point is None
    else:
        assert q.zero_point.dtype == torch.int32 and torch.equal(q.zero_point, z)


def rand(shape, gen, dtype=F32, scale=2.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


# ---------------------------------------------------------------------------
# Bit-exact against the oracle, each Triton variant
# ---------------------------------------------------------------------------
CASES = [
    # (shape, granularity, block, axis, variant)
    ((6, 40), "token", None, -1, "triton_fused"),
    ((2, 3, 24), "token", None, -1, "triton_stats"),
    ((5, 7, 9), "tensor", None, -1, "triton_stats"),
    ((24, 40), "channel", None, -1, "triton_stats"),
    ((24, 40), "channel", None, 0, "triton_fused"),
    ((3, 10, 6), "channel", None, 1, "triton_stats"),  # axis moved by a copy
    ((130, 200), "block", (64, 96), -1, "triton_fused"),  # ragged edges
    ((50, 260), "block", (1, 128), -1, "triton_fused"),
    ((40, 45), "block", (12, 20), -1, "triton_fused"),  # non-power-of-two blocks
]


@pytest.mark.parametrize("shape,granularity,block,axis,variant", CASES,
                         ids=[f"{c[1]}-{'x'.join(map(str, c[0]))}-{c[4]}" for c in CASES])
@pytest.mark.parametrize("qdtype,dtype,symmetric", [(I8, BF16, True), (I8, F32, False), (E4, F16, True),
                                                    (E5, BF16, True)], ids=["i8", "i8asym", "e4m3", "e5m2"])
def test_bit_exact_dynamic(shape, granularity, block, axis, variant, qdtype, dtype, symmetric, gen):
    x = rand(shape, gen, dtype, scale=3.0)
    with force_variant("quantize", variant):
        q = Q.quantize(x, qdtype, granularity, block=block, axis=axis, symmetric=symmetric)
    assert_same(q, oracle(x, qdtype, granularity, block, axis, symmetric))


@pytest.mark.parametrize("qdtype,symmetric", [(I8, False), (E4, True)], ids=["i8asym", "e4m3"])
def test_long_rows_run_two_pass(qdtype, symmetric, gen):
    x = rand((2, K.ROW_LIMIT + 700), gen, BF16, scale=3.0)
    assert Q.QUANTIZE.variant("triton_fused").check(x, qdtype, "token", [], -1, symmetric) is not None
    q = Q.quantize(x, qdtype, "token", symmetric=symmetric)
    assert_same(q, oracle(x, qdtype, "token", None, -1, symmetric))


@pytest.mark.parametrize("granularity,block,axis", [("tensor", None, -1), ("token", None, -1),
                                                    ("channel", None, -1), ("block", (8, 16), -1)])
@pytest.mark.parametrize("qdtype,symmetric", [(I8, True), (I8, False), (E4, True)], ids=["i8", "i8asym", "e4m3"])
def test_bit_exact_static(granularity, block, axis, qdtype, symmetric, gen):
    x = rand((20, 36), gen, BF16, scale=3.0)
    # Scales from other data (calibration), so values saturate too.
    _, s, z = oracle(rand((20, 36), gen, F32, scale=2.0), qdtype, granularity, block, axis, symmetric)
    with force_variant("quantize", "triton_static"):
        q = Q.quantize(x, qdtype, granularity, block=block, axis=axis, symmetric=symmetric, scale=s, zero_point=z)
    assert_same(q, oracle(x, qdtype, granularity, block, axis, symmetric, scale=s, zero_point=z))


# ---------------------------------------------------------------------------
# Hand-computed values: ties, NaN, inf, fp8 subnormals
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["triton_fused", "triton_stats"])
def test_round_half_to_even(variant):
    # absmax 127 -> scale 1, inv 1: the values are their own quotients.
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5, -127.0, 127.0, 0.49999997, 5.5]])
    with force_variant("quantize", variant):
        q = Q.quantize(x, I8, "token")
    assert q.scale.item() == 1.0
    assert q.data.tolist() == [[0, 2, 2, 0, -2, -2, 4, 126, -127, 127, 0, 6]]


@pytest.mark.parametrize("variant", ["triton_fused", "triton_stats"])
def test_nan_inf_saturate(variant):
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[nan, inf, -inf, 1.0, -2.0, 0.0, 0.5, -0.25]])
    with force_variant("quantize", variant):
        qi = Q.quantize(x, I8, "token")
        qa = Q.quantize(x, I8, "token", symmetric=False)
        qf = Q.quantize(x, E4, "token")
    # Scale from the finite values only: absmax 2.
    assert qi.scale.item() == np.float32(2.0) / np.float32(127.0)
    assert qi.data.tolist() == [[0, 127, -127, 64, -127, 0, 32, -16]]
    assert qa.zero_point.item() == 42 and qa.data[0, :3].tolist() == [0, 127, -128]  # (2 + 1) / 255 range
    f = qf.data.float()[0]
    assert math.isnan(f[0]) and f[1].item() == 448.0 and f[2].item() == -448.0
    assert f[3].item() == 224.0 and f[4].item() == -448.0


@pytest.mark.parametrize("qdtype", [E4, E5])
@pytest.mark.parametrize("variant", ["triton_fused", "triton_stats"])
def test_fp8_subnormals_and_ties(qdtype, variant):
    # One large value fixes scale = 1 (absmax = qmax); the rest land on and
    # between fp8 subnormals and in the middle of normal spacings.
    qmax = QMAX[qdtype]
    sub = 2.0 ** (-9 if qdtype == E4 else -16)
    vals = [qmax, 1.5 * sub, 2.5 * sub, 0.5 * sub, -1.5 * sub, 0.75 * sub, 1.0 + 2.0 ** -(4 if qdtype == E4 else 3),
            -0.3 * sub, 3.0 * sub]
    x = torch.tensor([vals], dtype=F32)
    with force_variant("quantize", variant):
        q = Q.quantize(x, qdtype, "token")
    assert q.scale.item() == 1.0
    expect = torch.tensor([vals]).to(qdtype)  # torch's RNE cast of exact quotients
    assert torch.equal(bits(q.data), bits(expect))
    assert q.data.float()[0, 1].item() == 2 * sub and q.data.float()[0, 2].item() == 2 * sub
    assert q.data.float()[0, 3].item() == 0.0 and torch.signbit(q.data.float()[0, 7])  # -0.0 kept


def test_all_zero_group_scale_is_smallest_normal():
    x = torch.zeros(3, 8)
    x[1] = 1.0
    q = Q.quantize(x, I8, "token")
    assert q.scale[0].item() == TINY and q.scale[2].item() == TINY
    assert q.data[0].abs().sum() == 0 and q.data[1].tolist() == [127] * 8


# ---------------------------------------------------------------------------
# Layouts: non-contiguous inputs, empty tensors, size-1 dims, 0-dim
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("granularity,block", [("token", None), ("tensor", None), ("channel", None),
                                               ("block", (4, 8))])
def test_non_contiguous(granularity, block, gen):
    base = rand((24, 40), gen, BF16)
    for x in (base.t(), base[::2, 3:30]):
        q = Q.quantize(x, I8, granularity, block=block, symmetric=False)
        assert q.data.is_contiguous()
        assert_same(q, oracle(x, I8, granularity, block, -1, False))


@pytest.mark.parametrize("shape,granularity", [((0, 8), "token"), ((4, 0), "token"), ((0,), "tensor"),
                                               ((0, 5), "channel"), ((1, 1), "token"), ((), "tensor"),
                                               ((7, 1), "channel")])
def test_empty_size1_and_scalar(shape, granularity, gen):
    x = rand(shape, gen)
    for variant in ("triton_fused", "triton_stats", "reference"):
        if variant == "triton_fused" and granularity != "token":
            continue
        with force_variant("quantize", variant):
            q = Q.quantize(x, I8, granularity, symmetric=False)
        assert_same(q, oracle(x, I8, granularity, None, -1, False))
        y = Q.dequantize(q)
        assert y.shape == x.shape and y.dtype == x.dtype


# ---------------------------------------------------------------------------
# Dequantize
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("granularity,block,axis", [("tensor", None, -1), ("token", None, -1),
                                                    ("channel", None, 0), ("channel", None, 1),
                                                    ("block", (8, 16), -1)])
@pytest.mark.parametrize("qdtype,symmetric", [(I8, True), (I8, False), (E5, True)], ids=["i8", "i8asym", "e5m2"])
def test_dequantize_bit_exact_fp32(granularity, block, axis, qdtype, symmetric, gen):
    x = rand((3, 20, 36) if axis == 1 else (20, 36), gen, F32, scale=3.0)
    q = Q.quantize(x, qdtype, granularity, block=block, axis=axis, symmetric=symmetric)
    with force_variant("dequantize", "triton_apply"):
        y = Q.dequantize(q, F32)
    lab, _ = _labels(tuple(x.shape), granularity, block, axis)
    s = q.scale.reshape(-1).numpy()[lab]
    qv = q.data.to(F32).numpy()
    if not symmetric:
        qv = qv - q.zero_point.reshape(-1).numpy().astype(np.float32)[lab]
    assert torch.equal(y, torch.from_numpy((qv * s).astype(np.float32)))


@pytest.mark.parametrize("out", [BF16, F16])
def test_dequantize_half_outputs(out, gen):
    x = rand((16, 64), gen, F32)
    q = Q.quantize(x, I8, "token")
    with force_variant("dequantize", "triton_apply"):
        y = Q.dequantize(q, out)
    ref = q.data.double() * q.scale.double()
    assert y.dtype == out
    assert (y.double() - ref).norm() / ref.norm() <= (1e-2 if out == BF16 else 1e-3)


@pytest.mark.parametrize("granularity,block", [("token", None), ("block", (4, 32)), ("tensor", None)])
def test_round_trip_error_bound(granularity, block, gen):
    # Independent of the rounding details: |x - dq(q(x))| <= scale / 2 (int8, symmetric, no saturation).
    x = rand((16, 64), gen, F32)
    q = Q.quantize(x, I8, granularity, block=block)
    y = Q.dequantize(q, F32).double()
    lab, _ = _labels((16, 64), granularity, block, -1)
    s = torch.from_numpy(q.scale.reshape(-1).double().numpy()[lab])
    assert bool(((y - x.double()).abs() <= s * 0.5 * (1 + 1e-6)).all())


def test_large_offsets_flag():
    # A view reaching past 2**31 elements needs 64-bit offsets; the plain case does not.
    assert K._int64(K._reach(2, 2**31, 2**31))
    assert not K._int64(K._reach(65536, 16384, 16384), 65536 * 16384)


@pytest.mark.parametrize("qdtype", [E4, E5])
def test_dequantize_fp8_specials(qdtype):
    # Every fp8 bit pattern (NaN, inf for e5m2, subnormals, -0) decodes exactly.
    data = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(qdtype).reshape(4, 64)
    s = torch.tensor([[2.0], [0.5], [1.0], [3.0]])
    with force_variant("dequantize", "triton_apply"):
        y = Q.dequantize(Q.QuantizedTensor(data, s, None, "token"), F32)
    ref = data.float() * s
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    ok = ~torch.isnan(ref)
    assert torch.equal(y[ok], ref[ok]) and torch.equal(torch.signbit(y[ok]), torch.signbit(ref[ok]))
