"""The scaled 8-bit GEMM under the Triton interpreter: every Triton variant
(forced), fp8 e4m3 / e4m3 x e5m2 / int8, per-tensor, rowwise and block scales
(and mixes), bias, activations, out dtypes, strided and batched operands, odd
sizes (K not a multiple of 16), NaN/Inf, empty and size-1 problems; the
registry, dispatch decisions, opcheck, torch.compile, quantized_matmul, the
vendor variant's code (torch._scaled_mm runs on CPU) and error messages.

The oracle is float64 torch on the dequantized operands, written out here.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import INTERPRETER_WARNINGS

from opforge.bench.case import rel_err
from opforge.ops import scaled_matmul as SM
from opforge.ops.quant import quantize
from opforge.ops.scaled_matmul import OP, ScaledEpilogue, quantized_matmul, scaled_matmul
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

I8, E4M3, E5M2 = torch.int8, torch.float8_e4m3fn, torch.float8_e5m2
BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
BOUND = {F32: 1e-5, BF16: 1e-2, F16: 1e-3}
ACT = {None: lambda t: t, "relu": torch.relu, "gelu": F.gelu,
       "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}

pytestmark = INTERPRETER_WARNINGS

SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 1, "num_stages": 2}


def qdata(shape, dtype, gen):
    x = torch.randn(shape, generator=gen, dtype=F32)
    if dtype == I8:
        return (x * 50).round().clamp(-127, 127).to(I8)
    return (x * 4).to(dtype)


def scales(shape, gen):
    return torch.rand(shape, generator=gen, dtype=F32) * 0.02 + 0.001


def make_scales(mode_a, mode_b, lead, K, N, gen):
    kb, nb = math.ceil(K / 128), math.ceil(N / 128)
    sa = {"tensor": (), "row": lead + (1,), "block": lead + (kb,)}[mode_a]
    sb = {"tensor": (1, 1), "row": (1, N), "block": (kb, nb)}[mode_b]
    return scales(sa, gen), scales(sb, gen)


def oracle(a, b, sa, sb, bias=None, activation=None):
    """float64: dequantize each operand element by element, multiply, epilogue."""
    K, N = a.shape[-1], b.shape[1]
    A = a.reshape(-1, K).to(F64)
    M = A.shape[0]
    sa64, sb64 = sa.to(F64), sb.to(F64)
    if sa.numel() == 1:
        A = A * sa64.reshape(())
    elif sa.shape[-1] == 1:
        A = A * sa64.reshape(M, 1)
    else:
        A = A * torch.stack([sa64.reshape(M, -1)[:, k // 128] for k in range(K)], dim=1)
    B = b.to(F64)
    if sb.numel() == 1:
        B = B * sb64.reshape(())
    elif sb.shape[0] == 1 and sb.shape[1] == N:
        B = B * sb64
    else:
        idx_k = torch.arange(K) // 128
        idx_n = torch.arange(N) // 128
        B = B * sb64[idx_k][:, idx_n]
    z = A @ B
    if bias is not None:
        z = z + bias.to(F64)
    return ACT[activation](z).reshape(tuple(a.shape[:-1]) + (N,))


def check(out, want, dtype):
    assert out.dtype == dtype and tuple(out.shape) == tuple(want.shape), (out.dtype, out.shape, want.shape)
    err = rel_err(out, want)
    assert err <= BOUND[dtype], err


def run(variant, cfg, a, b, sa, sb, bias=None, out_dtype=F32, activation=None, fast=False):
    epi = ScaledEpilogue(out_dtype, activation, fast, bias is not None)
    v = OP.variant(variant)
    if cfg is None:  # a forced config may take what the default one would not (split-K on a short K)
        assert dispatch.reject_reason(OP, v, (a, b, sa, sb, bias, epi)) is None
        cfg = v.default_config(a, b, sa, sb, bias, epi)
    return v.run(cfg, a, b, sa, sb, bias, epi)


# ---------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------
def test_registered_with_all_variants():
    op = registry.get("scaled_matmul")
    assert [v.name for v in op.variants] == ["gluon_ws", "triton_splitk", "triton_tma_persistent", "triton_tiled",
                                             "torch_scaled_mm", "reference"]
    assert op.variant("torch_scaled_mm").kind == "vendor" and op.variant("torch_scaled_mm").devices == ("cuda",)
    assert op.variant("reference").kind == "reference" and "cpu" in op.variant("reference").devices
    assert op.variant("triton_tma_persistent").min_capability == (9, 0)


def test_samples_reach_every_triton_variant_and_dtype():
    seen = {}
    modes = set()
    samples = OP.samples(torch.device("cpu"))
    for args in samples:
        OP.validate(*args)
        modes.add(SM.scale_modes(*args[:4]))
        for v in OP.variants:
            if v.kind == "triton" and dispatch.reject_reason(OP, v, args) is None:
                seen.setdefault(v.name, set()).add((args[0].dtype, args[1].dtype))
        assert SM._vendor_reason(*args) is None or isinstance(SM._vendor_reason(*args), str)
    for name in ("triton_splitk", "triton_tma_persistent", "triton_tiled"):
        assert {(E4M3, E4M3), (I8, I8), (E4M3, E5M2)} <= seen[name], (name, seen[name])
    assert {(0, 0), (1, 1), (2, 2)} <= modes
    assert any(SM._vendor_reason(*args) is None for args in samples)


def test_dispatch_decisions(gen):
    def chosen(a, b, sa, sb):
        return dispatch.explain("scaled_matmul", a, b, sa, sb, None, ScaledEpilogue()).variant.name

    w = qdata((48, 64), E4M3, gen)
    a = qdata((32, 64), E4M3, gen)
    one = torch.ones(())
    assert chosen(a, w.t(), one, one) == "triton_tma_persistent"  # both K-major, aligned
    assert chosen(a, w.t().contiguous(), one, one) == "triton_tiled"  # b row-major (N-major)
    assert chosen(qdata((32, 40), I8, gen), qdata((24, 40), I8, gen).t(), one, one) == "triton_tiled"  # K % 16
    assert chosen(qdata((2, 4096), E4M3, gen), qdata((64, 4096), E4M3, gen).t(), one, one) == "triton_splitk"
    text = str(dispatch.explain("scaled_matmul", a, w.t().contiguous(), one, one, None, ScaledEpilogue()))
    assert "rejected triton_tma_persistent" in text and "K-major" in text
    assert "rejected torch_scaled_mm" in text and "rejected triton_splitk" in text


def test_memo_key_and_dtype_key_see_epilogue_and_modes(gen):
    a, w = qdata((16, 32), E4M3, gen), qdata((16, 32), E4M3, gen)
    one = torch.ones(())
    k1 = OP.memo_key(a, w.t(), one, one, None, ScaledEpilogue())
    k2 = OP.memo_key(a, w.t(), one, one, None, ScaledEpilogue(fast_accum=True))
    k3 = OP.memo_key(a, w.t(), torch.ones(16, 1), one, None, ScaledEpilogue())
    assert len({k1, k2, k3}) == 3
    assert OP.dtype_key(a, w.t(), one, one, None, ScaledEpilogue(F16, None, True)) == \
        "float8_e4m3fnxfloat8_e4m3fn->float16+fastacc"
    assert SM.bucket(a, w.t(), torch.ones(16, 1), torch.ones(1, 16)) == "16x16x32:rr"


# ---------------------------------------------------------------------------
# Kernels against the oracle
# ---------------------------------------------------------------------------
PAIRS = [(E4M3, E4M3), (I8, I8), (E4M3, E5M2)]
MODES = [("tensor", "tensor"), ("row", "row"), ("block", "block"), ("row", "block"), ("block", "tensor")]


@pytest.mark.parametrize("pair", PAIRS, ids=["e4m3", "int8", "e4m3xe5m2"])
@pytest.mark.parametrize("modes", MODES, ids=["-".join(m) for m in MODES])
def test_tiled_every_dtype_and_scale_mode(pair, modes, gen):
    M, N, K = 37, 29, (200 if "block" in modes else 40)  # odd sizes, K not a multiple of 16
    a, b = qdata((M, K), pair[0], gen), qdata((K, N), pair[1], gen)  # b row-major
    sa, sb = make_scales(*modes, (M,), K, N, gen)
    with force_variant("scaled_matmul", "triton_tiled"):
        out = scaled_matmul(a, b, sa, sb, out_dtype=F32)
    check(out, oracle(a, b, sa, sb), F32)


@pytest.mark.parametrize("pair", PAIRS[:2], ids=["e4m3", "int8"])
@pytest.mark.parametrize("modes", MODES[:3], ids=["-".join(m) for m in MODES[:3]])
def test_tma_k_major_weight(pair, modes, gen):
    M, N, K = 33, 40, 160  # K tail of 32 past the last 128 block; TMA zero-fills edges
    a, w = qdata((M, K), pair[0], gen), qdata((N, K), pair[1], gen)
    sa, sb = make_scales(*modes, (M,), K, N, gen)
    cfg = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 2, "num_warps": 4, "num_stages": 2,
           "FLATTEN": False}
    out = run("triton_tma_persistent", cfg, a, w.t(), sa, sb)
    check(out, oracle(a, w.t(), sa, sb), F32)
    # The persistent loop: fewer programs than tiles.
    from opforge.kernels import gemm_scaled as K_

    C = torch.empty((M, N), dtype=F32)
    SA, SB = SM.scales_2d(a, sa, sb, SM.scale_modes(a, w.t(), sa, sb))
    K_.launch_tma(a, w.t(), C, SA, SB, *SM.scale_modes(a, w.t(), sa, sb), None, 0, False, cfg, sms=2)
    check(C, oracle(a, w.t(), sa, sb), F32)


@pytest.mark.parametrize("pair,modes", [((E4M3, E4M3), ("row", "row")), ((I8, I8), ("block", "block")),
                                        ((I8, I8), ("tensor", "row"))])
def test_splitk_slices(pair, modes, gen):
    M, N, K = 3, 24, 300
    a, w = qdata((M, K), pair[0], gen), qdata((N, K), pair[1], gen)
    bias = torch.randn(N, generator=gen)
    sa, sb = make_scales(*modes, (M,), K, N, gen)
    out = run("triton_splitk", dict(SMALL, SPLIT_K=4), a, w.t(), sa, sb, bias, F32, "gelu")
    check(out, oracle(a, w.t(), sa, sb, bias, "gelu"), F32)


def test_splitk_default_dispatch_on_decode_shape(gen):
    a, w = qdata((2, 4096), I8, gen), qdata((32, 4096), I8, gen)
    sa, sb = scales((2, 1), gen), scales((1, 32), gen)
    d = dispatch.explain("scaled_matmul", a, w.t(), sa, sb, None, ScaledEpilogue(F32))
    assert d.variant.name == "triton_splitk" and d.config["SPLIT_K"] >= 2
    check(scaled_matmul(a, w.t(), sa, sb, out_dtype=F32), oracle(a, w.t(), sa, sb), F32)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_bias_activation_bf16_out(activation, gen):
    M, N, K = 20, 24, 64
    a, w = qdata((M, K), E4M3, gen), qdata((N, K), E4M3, gen)
    sa, sb = scales((M, 1), gen), scales((1, N), gen)
    bias = torch.randn(N, generator=gen)
    out = scaled_matmul(a, w.t(), sa, sb, bias=bias, activation=activation)  # default out_dtype bf16
    check(out, oracle(a, w.t(), sa, sb, bias, activation), BF16)


def test_fp16_out_with_fp16_bias_and_fast_accum(gen):
    M, N, K = 17, 33, 96
    a, w = qdata((M, K), I8, gen), qdata((N, K), I8, gen)
    sa, sb = scales((), gen), scales((1, N), gen)
    bias = torch.randn(N, generator=gen).to(F16)
    for fast in (False, True):
        out = scaled_matmul(a, w.t(), sa, sb, bias=bias, out_dtype=F16, use_fast_accum=fast)
        check(out, oracle(a, w.t(), sa, sb, bias), F16)


def test_batched_a_strided_operands_and_scales(gen):
    B, M, N, K = 2, 5, 24, 48
    a = qdata((B, M, K), E4M3, gen)
    w = qdata((N, K), E4M3, gen)
    sa = scales((B, M, 1), gen)
    sb = scales((N, 1), gen).t()  # (1, N) with a non-unit stride pattern
    out = scaled_matmul(a, w.t(), sa, sb, out_dtype=F32)
    assert out.shape == (B, M, N)
    check(out, oracle(a, w.t(), sa, sb), F32)
    # a non-contiguous (every other column of a wider tensor), b a strided slice
    big = qdata((M, 2 * K), I8, gen)
    a2 = big[:, ::2]
    bbig = qdata((K, 2 * N), I8, gen)
    b2 = bbig[:, 1::2]
    sa2, sb2 = scales((M, 1), gen), scales((1, N), gen)
    for variant in ("triton_tiled", "triton_tma_persistent"):
        if dispatch.reject_reason(OP, OP.variant(variant), (a2, b2, sa2, sb2, None, ScaledEpilogue(F32))):
            continue
        with force_variant("scaled_matmul", variant):
            check(scaled_matmul(a2, b2, sa2, sb2, out_dtype=F32), oracle(a2, b2, sa2, sb2), F32)
    # a batched a whose leading dims do not collapse into a view (copied), block scales
    a3 = qdata((M, B, 160), I8, gen).transpose(0, 1)
    sa3 = scales((B, M, 2), gen)
    w3 = qdata((N, 160), I8, gen)
    sb3 = scales((2, 1), gen)
    check(scaled_matmul(a3, w3.t(), sa3, sb3, out_dtype=F32), oracle(a3, w3.t(), sa3, sb3), F32)


def test_nan_inf_propagate(gen):
    """NaN / Inf through the fp32 scales and bias (the Triton interpreter decodes
    fp8 NaN / Inf codes as finite numbers, so fp8 specials in the operands are
    checked on the reference path here and on the GPU by selftest)."""
    M, N, K = 8, 16, 32
    a, w = qdata((M, K), E4M3, gen), qdata((N, K), E4M3, gen)
    sa, sb = scales((M, 1), gen), scales((1, N), gen)
    sa[2, 0] = float("nan")  # (an inf scale is not tested: (a * inf) @ b and (a @ b) * inf differ)
    sb[0, 5] = float("nan")
    bias = torch.randn(N, generator=gen)
    bias[9] = float("-inf")
    want = oracle(a, w.t(), sa, sb, bias)
    for variant in ("triton_tiled", "triton_tma_persistent"):
        with force_variant("scaled_matmul", variant):
            out = scaled_matmul(a, w.t(), sa, sb, bias=bias, out_dtype=F32)
        assert torch.isnan(out[:, 5]).all() and torch.isnan(out[2]).all()
        assert (out[:2, 9] == -math.inf).all() and torch.isfinite(out[:2, :5]).all()
        check(out, want, F32)
    a8 = qdata((M, K), E5M2, gen)
    a8[1, 3], a8[4, 0] = float("inf"), float("nan")
    with force_variant("scaled_matmul", "reference"):
        out = scaled_matmul(a8, w.t(), sa, sb, out_dtype=F32)
    assert torch.isnan(out[4]).all() and not torch.isfinite(out[1]).any()
    check(out, oracle(a8, w.t(), sa, sb), F32)


def test_empty_and_size_one(gen):
    one = torch.ones(())
    for M, N, K in ((0, 8, 16), (4, 0, 16), (1, 1, 1), (1, 9, 3)):
        a, w = qdata((M, K), I8, gen), qdata((N, K), I8, gen)
        out = scaled_matmul(a, w.t(), one, one, out_dtype=F32)
        assert out.shape == (M, N)
        if out.numel():
            check(out, oracle(a, w.t(), one, one), F32)
    # K = 0: the product is zero; the epilogue still runs
    bias = torch.randn(6, generator=gen)
    out = scaled_matmul(torch.empty((3, 0), dtype=E4M3), torch.empty((0, 6), dtype=E4M3), one, one,
                        bias=bias, activation="relu", out_dtype=F32)
    assert torch.equal(out, torch.relu(bias).expand(3, 6))
    # 1-D a: one token
    a1, w1 = qdata((32,), E4M3, gen), qdata((8, 32), E4M3, gen)
    out = scaled_matmul(a1, w1.t(), scales((1,), gen), scales((1, 8), gen), out_dtype=F32)
    assert out.shape == (8,)


def test_error_within_1_2x_of_torch_scaled_mm(gen):
    """torch._scaled_mm runs on CPU: same inputs, both against the float64 oracle.
    The kernel's fp32 result is rounded to bf16 by torch (round to nearest, as
    the GPU's store does; the interpreter's own bf16 store truncates)."""
    M, N, K = 48, 32, 256
    a, w = qdata((M, K), E4M3, gen), qdata((N, K), E4M3, gen)
    for sa, sb in ((scales((), gen), scales((), gen)), (scales((M, 1), gen), scales((1, N), gen))):
        want = oracle(a, w.t(), sa, sb)
        ours = scaled_matmul(a, w.t(), sa, sb, out_dtype=F32)
        assert rel_err(ours, want) <= 1e-6
        peer = rel_err(torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=BF16), want)
        assert rel_err(ours.to(BF16), want) <= 1.2 * peer, (rel_err(ours.to(BF16), want), peer)


def test_vendor_variant_code_and_reasons(gen):
    """The vendor run is exercised on CPU tensors (torch._scaled_mm / _int_mm exist
    there); dispatch itself keeps the variant to CUDA."""
    v = OP.variant("torch_scaled_mm")
    M, N, K = 32, 48, 64
    bias = torch.randn(N, generator=gen)
    for dt, (ma, mb) in ((E4M3, ("tensor", "tensor")), (E4M3, ("row", "row")), (I8, ("row", "row"))):
        a, w = qdata((M, K), dt, gen), qdata((N, K), dt, gen)
        sa, sb = make_scales(ma, mb, (M,), K, N, gen)
        args = (a, w.t(), sa, sb, bias, ScaledEpilogue(BF16, "silu", False, True))
        assert SM._vendor_reason(*args) is None
        check(v.run({}, *args), oracle(a, w.t(), sa, sb, bias, "silu"), BF16)
    a, w = qdata((8, 64), I8, gen), qdata((16, 64), I8, gen)
    assert "M > 16" in SM._vendor_reason(a, w.t(), torch.ones(()), torch.ones(()), None, ScaledEpilogue())
    sa, sb = make_scales("block", "block", (32,), 256, 16, gen)
    assert "block" in SM._vendor_reason(qdata((32, 256), E4M3, gen), qdata((256, 16), E4M3, gen), sa, sb)
    assert "cuda" in dispatch.reject_reason(OP, v, (a, w.t(), torch.ones(()), torch.ones(()), None, ScaledEpilogue()))


# ---------------------------------------------------------------------------
# torch.library, compile, quantized_matmul, errors
# ---------------------------------------------------------------------------
def test_library_path_and_opcheck(gen):
    a, w = qdata((9, 32), E4M3, gen), qdata((8, 32), E4M3, gen)
    sa, sb = scales((9, 1), gen), scales((1, 8), gen)
    bias = torch.randn(8, generator=gen)
    direct = scaled_matmul(a, w.t(), sa, sb, bias=bias, activation="relu")
    lib = torch.ops.opforge.scaled_matmul.default(a, w.t(), sa, sb, bias, BF16, "relu", False)
    assert torch.equal(direct, lib)
    # opcheck's schema check compares fp8 tensors with ops CPU torch lacks for fp8: int8 here.
    ai, wi = qdata((9, 32), I8, gen), qdata((8, 32), I8, gen)
    torch.library.opcheck(torch.ops.opforge.scaled_matmul.default, (ai, wi.t(), sa, sb, bias, F32),
                          {"activation": "gelu"})


def test_compile_fullgraph(gen):
    a, w = qdata((6, 32), I8, gen), qdata((16, 32), I8, gen)
    sa, sb = scales((6, 1), gen), scales((1, 16), gen)

    a8, w8 = qdata((6, 32), E4M3, gen), qdata((16, 32), E5M2, gen)

    def f(a, b, a8, b8, sa, sb):
        y = scaled_matmul(a, b, sa, sb, out_dtype=F32, activation="silu") * 2
        return y, scaled_matmul(a8, b8, sa, sb, bias=torch.ones(16), out_dtype=F32)

    out, out8 = torch.compile(f, fullgraph=True, backend="eager")(a, w.t(), a8, w8.t(), sa, sb)
    check(out, oracle(a, w.t(), sa, sb, None, "silu") * 2, F32)
    check(out8, oracle(a8, w8.t(), sa, sb, torch.ones(16)), F32)


def test_quantized_matmul_maps_granularities(gen):
    x = torch.randn((12, 160), generator=gen)
    wt = torch.randn((160, 24), generator=gen) * 0.1  # [K, N]
    for dtype in (I8, E4M3):
        qa, qb = quantize(x, dtype, "token"), quantize(wt, dtype, "channel", axis=-1)
        assert qb.scale.shape == (1, 24)
        out = quantized_matmul(qa, qb, out_dtype=F32)
        check(out, oracle(qa.data, qb.data, qa.scale, qb.scale), F32)
        assert rel_err(out, x.double() @ wt.double()) < (2e-2 if dtype == I8 else 8e-2)
    qa, qb = quantize(x, E4M3, "block", block=(1, 128)), quantize(wt, E4M3, "block", block=(128, 128))
    check(quantized_matmul(qa, qb, out_dtype=F32), oracle(qa.data, qb.data, qa.scale, qb.scale), F32)
    qa_t, qb_t = quantize(x, I8, "tensor"), quantize(wt, I8, "tensor")
    check(quantized_matmul(qa_t, qb_t, out_dtype=F32), oracle(qa_t.data, qb_t.data, qa_t.scale, qb_t.scale), F32)
    with pytest.raises(ValueError, match="asymmetric"):
        quantized_matmul(quantize(x, I8, "token", symmetric=False), qb_t)
    with pytest.raises(ValueError, match="qb's granularity 'channel'"):
        quantized_matmul(qa_t, quantize(wt, I8, "channel", axis=0))
    with pytest.raises(ValueError, match=r"qa's granularity 'block'"):
        quantized_matmul(quantize(x, I8, "block", block=(4, 128)), qb_t)
    with pytest.raises(TypeError, match="QuantizedTensor"):
        quantized_matmul(x, qb_t)


def test_clear_errors(gen):
    a, w = qdata((8, 32), E4M3, gen), qdata((16, 32), E4M3, gen)
    one = torch.ones(())
    cases = [
        ((a.float(), w.t(), one, one), {}, TypeError, "a must be int8, float8_e4m3fn or float8_e5m2"),
        ((a, qdata((16, 32), I8, gen).t(), one, one), {}, TypeError, "int8 pairs with int8"),
        ((qdata((8, 32), E5M2, gen), qdata((32, 16), E5M2, gen), one, one), {}, TypeError, "e5m2 x float8_e5m2"),
        ((a, qdata((16, 40), E4M3, gen).t(), one, one), {}, ValueError, "a has K=32 .* but b has K=40"),
        ((a, w, one, one), {}, ValueError, "a has K=32"),
        ((a, w.t().unsqueeze(0), one, one), {}, ValueError, "b must be 2-D"),
        ((a, w.t(), torch.ones(8), one), {}, ValueError, r"scale_a has shape \(8,\); expected one element"),
        ((a, w.t(), one, torch.ones(16, 1)), {}, ValueError, r"scale_b has shape \(16, 1\)"),
        ((a, w.t(), one.double(), one), {}, TypeError, "scale_a must be float32"),
        ((a, w.t(), one, one), {"out_dtype": F64}, TypeError, "out_dtype must be"),
        ((a, w.t(), one, one), {"activation": "tanh"}, ValueError, "activation must be None or one of"),
        ((a, w.t(), one, one), {"bias": torch.ones(15)}, ValueError, r"bias must have shape \(16,\)"),
        ((a, w.t(), one, one), {"bias": torch.ones(16, dtype=F16)}, TypeError, "bias is float16"),
        ((a, w.t(), one, one), {"use_fast_accum": 1}, TypeError, "use_fast_accum must be a bool"),
        ((a, w.t(), "1", one), {}, TypeError, "scale_a must be a torch.Tensor"),
    ]
    for args, kw, exc, msg in cases:
        with pytest.raises(exc, match=msg) as info:
            scaled_matmul(*args, **kw)
        assert str(info.value).startswith("opforge.scaled_matmul:"), info.value
    with pytest.raises(ValueError, match="int32 accumulator"):
        SM.validate(torch.zeros((1, 140000), dtype=I8), torch.zeros((140000, 1), dtype=I8), one, one)
