"""GEMM kernels under the Triton interpreter: each variant forced (or run with
small forced configs), odd sizes (K not a multiple of 16), every transposition,
strided and batched operands, each epilogue and out_dtype, split-K with
several slices, NaN/Inf, empty and size-1 problems. The oracle is torch in
float64, written out here (never opforge's own reference).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import INTERPRETER_WARNINGS, rand

from opforge.bench.case import rel_err
from opforge.kernels import gemm as K
from opforge.ops.matmul import OP, Epilogue, matmul
from opforge.runtime import dispatch
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
BOUND = {F32: 1e-5, BF16: 1e-2, F16: 1e-3, F64: 1e-12}
ACTS = (None, "relu", "gelu", "gelu_tanh", "silu")

pytestmark = INTERPRETER_WARNINGS


def oracle(a, b, bias=None, activation=None, residual=None):
    z = torch.matmul(a.double(), b.double())
    if bias is not None:
        z = z + bias.double()
    z = {"relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
         "silu": F.silu}.get(activation, lambda t: t)(z)
    return z + residual.double() if residual is not None else z


def check(out, want, dtype):
    assert out.dtype == dtype and tuple(out.shape) == tuple(want.shape), (out.dtype, out.shape, want.shape)
    err = rel_err(out, want)
    assert err <= BOUND[dtype], err


def epi(bias=None, residual=None, activation=None, out_dtype=None, tf32=False):
    return Epilogue(activation, out_dtype, tf32, bias is not None, residual is not None)


def run(variant, cfg, a, b, bias=None, residual=None, activation=None, out_dtype=None):
    return OP.variant(variant).run(cfg, a, b, bias, residual, epi(bias, residual, activation, out_dtype))


SMALL = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 1, "num_stages": 2}


def layouts(gen, M, N, Kd, dtype):
    """(name, a, b): row-major, transposed A, transposed B (Linear weight), both."""
    return [
        ("nn", rand((M, Kd), gen, dtype), rand((Kd, N), gen, dtype)),
        ("tn", rand((Kd, M), gen, dtype).t(), rand((Kd, N), gen, dtype)),
        ("nt", rand((M, Kd), gen, dtype), rand((N, Kd), gen, dtype).t()),
        ("tt", rand((Kd, M), gen, dtype).t(), rand((N, Kd), gen, dtype).t()),
    ]


# ---------------------------------------------------------------------------
# Portable tiled kernel
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64], ids=str)
def test_tiled_odd_sizes_every_transposition(dtype, gen):
    for name, a, b in layouts(gen, 37, 29, 45, dtype):
        with force_variant("matmul", "triton_tiled"):
            check(matmul(a, b), oracle(a, b), dtype)


@pytest.mark.parametrize("activation", ACTS)
def test_tiled_epilogues_small_tiles(activation, gen):
    # Small tiles: several tiles each way, several K steps with a K tail, grouped order.
    a, b = rand((37, 45), gen), rand((45, 29), gen)
    bias, res = rand(29, gen), rand((37, 29), gen)
    check(run("triton_tiled", SMALL, a, b, bias, res, activation), oracle(a, b, bias, activation, res), F32)


def test_tiled_strided_operands(gen):
    # Neither operand has a unit stride: only the pointer kernel takes them.
    a = rand((40, 90), gen)[:, ::2]
    b = rand((90, 62), gen)[::2, ::2]
    assert a.stride(1) != 1 and b.stride(1) != 1 and b.stride(0) != 1
    with force_variant("matmul", "triton_tiled"):
        check(matmul(a, b), oracle(a, b), F32)
    reason = dispatch.reject_reason(OP, OP.variant("triton_tma_persistent"), (a, b, None, None, epi()))
    assert reason is not None and "unit stride" in reason


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_tiled_batched_and_broadcast(dtype, gen):
    a3, b3 = rand((3, 13, 21), gen, dtype), rand((3, 21, 17), gen, dtype)
    b1 = rand((1, 21, 17), gen, dtype)
    a_t = rand((13, 3, 21), gen, dtype).transpose(0, 1)  # leading dims do not collapse
    b2 = rand((21, 17), gen, dtype)
    res = rand((17,), gen, dtype)
    with force_variant("matmul", "triton_tiled"):
        check(matmul(a3, b3, residual=res), oracle(a3, b3, residual=res), dtype)
        check(matmul(a3, b1), oracle(a3, b1), dtype)
        check(matmul(a_t, b2, activation="silu"), oracle(a_t, b2, activation="silu"), dtype)
        check(matmul(a3[0], b3), oracle(a3[0], b3), dtype)


def test_tiled_out_dtype(gen):
    a, b = rand((19, 40), gen, BF16), rand((40, 23), gen, BF16)
    bias = rand(23, gen, F32)
    with force_variant("matmul", "triton_tiled"):
        check(matmul(a, b, bias=bias, out_dtype=F32), oracle(a, b, bias), F32)
        x, y = rand((19, 40), gen), rand((40, 23), gen)
        check(matmul(x, y, out_dtype=BF16), oracle(x, y), BF16)


# ---------------------------------------------------------------------------
# Hopper TMA persistent kernel (descriptors run under the interpreter too)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
def test_tma_every_transposition_k_tail(dtype, gen):
    # K = 56 is not a multiple of 16: the descriptor zero-fills the tail block.
    for name, a, b in layouts(gen, 40, 48, 56, dtype):
        with force_variant("matmul", "triton_tma_persistent"):
            check(matmul(a, b), oracle(a, b), dtype)


@pytest.mark.parametrize("activation", ["gelu", "silu"])
def test_tma_persistent_tiles_and_epilogue(activation, gen):
    # 16x16 tiles over a 40x48 output: 9 tiles, several K steps.
    a, b = rand((40, 64), gen), rand((48, 64), gen).t()
    bias, res = rand(48, gen), rand((40, 48), gen)
    cfg = dict(SMALL, FLATTEN=False)
    out = OP.variant("triton_tma_persistent").run(cfg, a, b, bias, res, epi(bias, res, activation))
    check(out, oracle(a, b, bias, activation, res), F32)
    # Fewer programs than tiles: each program walks several tiles.
    C = torch.empty(40, 48)
    K.launch_tma(a, b, C, bias, res, K.ACTIVATIONS[activation], False, cfg, sms=2)
    check(C, oracle(a, b, bias, activation, res), F32)


def test_tma_rejects_what_it_cannot_load(gen):
    v = OP.variant("triton_tma_persistent")
    odd = rand((37, 45), gen, BF16), rand((45, 29), gen, BF16)  # 90-byte rows
    batched = rand((2, 16, 32), gen, BF16), rand((2, 32, 16), gen, BF16)
    assert "16 bytes" in dispatch.reject_reason(OP, v, (*odd, None, None, epi()))
    assert "2-D problems" in dispatch.reject_reason(OP, v, (*batched, None, None, epi()))
    assert "dtype" in dispatch.reject_reason(OP, v, (rand((16, 16), gen, F64), rand((16, 16), gen, F64),
                                                     None, None, epi()))


# ---------------------------------------------------------------------------
# Split-K (decode path)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, F64], ids=str)
def test_splitk_slices_with_epilogue(dtype, gen):
    a, b = rand((3, 300), gen, dtype), rand((29, 300), gen, dtype, 0.1).t()
    bias, res = rand(29, gen, dtype), rand((3, 29), gen, dtype)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 1, "SPLIT_K": 4, "num_warps": 1}
    out = run("triton_splitk", cfg, a, b, bias, res, "gelu_tanh")
    check(out, oracle(a, b, bias, "gelu_tanh", res), dtype)
    # The slices are summed in a fixed order: bitwise reproducible.
    assert torch.equal(out, run("triton_splitk", cfg, a, b, bias, res, "gelu_tanh"))


def test_splitk_batched_uneven_slices(gen):
    # K = 301: the last slice is short and has a K tail.
    a, b = rand((2, 5, 301), gen), rand((2, 301, 18), gen)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 1, "SPLIT_K": 3, "num_warps": 1}
    check(run("triton_splitk", cfg, a, b), oracle(a, b), F32)


def test_splitk_dispatch_for_decode_shapes(gen):
    a, b = rand((4, 2048), gen, BF16), rand((64, 2048), gen, BF16).t()
    d = dispatch.explain("matmul", a, b, None, None, epi())
    assert d.variant.name == "triton_splitk" and d.config["SPLIT_K"] >= 2
    big = rand((128, 2048), gen, BF16)
    assert dispatch.explain("matmul", big, b, None, None, epi()).variant.name != "triton_splitk"


# ---------------------------------------------------------------------------
# Gradient epilogues (the backward's residual * act'(z))
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_gradient_epilogue(activation, gen):
    a, b, bias, g = rand((21, 33), gen), rand((33, 19), gen), rand(19, gen), rand((21, 19), gen)
    z = (a.double() @ b.double() + bias.double()).requires_grad_()
    (want,) = torch.autograd.grad(oracle(z, torch.eye(19, dtype=F64), activation=activation), z, g.double())
    for variant, cfg in (("triton_tiled", SMALL), ("triton_tma_persistent", dict(SMALL, FLATTEN=False))):
        if variant == "triton_tma_persistent":
            a_, b_ = rand((24, 32), gen), rand((32, 16), gen)
            bias_, g_ = rand(16, gen), rand((24, 16), gen)
            z_ = (a_.double() @ b_.double() + bias_.double()).requires_grad_()
            (want_,) = torch.autograd.grad(oracle(z_, torch.eye(16, dtype=F64), activation=activation), z_,
                                           g_.double())
            out = run(variant, cfg, a_, b_, bias_, g_, f"{activation}_grad")
            check(out, want_, F32)
        else:
            check(run(variant, cfg, a, b, bias, g, f"{activation}_grad"), want, F32)


# ---------------------------------------------------------------------------
# Special values, empty and size-1 problems
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["triton_tiled", "triton_tma_persistent"])
def test_nan_and_inf_propagate(variant, gen):
    a, b = rand((16, 32), gen), rand((32, 16), gen)
    a[2, 5] = float("nan")
    a[7, 1] = float("inf")
    b[:, 3] = 0.0  # inf * 0 = nan in column 3 of row 7
    with force_variant("matmul", variant):
        out = matmul(a, b, activation="relu")
    want = torch.relu(a.double() @ b.double())
    assert torch.isnan(out[2]).all() and torch.isnan(out[7, 3])
    assert torch.equal(torch.isnan(out), torch.isnan(want)) and torch.equal(torch.isinf(out), torch.isinf(want))


@pytest.mark.parametrize("variant", ["triton_tiled", "triton_tma_persistent"])
def test_empty_and_size_one(variant, gen):
    with force_variant("matmul", variant):
        assert matmul(torch.empty(0, 16), torch.empty(16, 8)).shape == (0, 8)
        assert matmul(torch.empty(8, 16), torch.empty(16, 0)).shape == (8, 0)
        bias = rand(8, gen)
        out = matmul(torch.empty(4, 0), torch.empty(0, 8), bias=bias, activation="silu")
        check(out, F.silu(bias.double()).expand(4, 8), F32)
    with force_variant("matmul", "triton_tiled"):
        for M, N, Kd in ((1, 1, 1), (1, 7, 5), (6, 1, 5), (6, 7, 1)):
            a, b = rand((M, Kd), gen), rand((Kd, N), gen)
            bias = rand(N, gen)
            check(matmul(a, b, bias=bias), oracle(a, b, bias), F32)


# ---------------------------------------------------------------------------
# Configs and launch planning
# ---------------------------------------------------------------------------
def test_default_configs_per_shape_class():
    big = K.tile_default_config(1, 8192, 8192, 8192, 2)
    assert (big["BLOCK_M"], big["BLOCK_N"], big["BLOCK_K"], big["num_warps"]) == (128, 256, 64, 8)
    small = K.tile_default_config(1, 1024, 1024, 1024, 2)
    assert small["BLOCK_M"] * small["BLOCK_N"] < 128 * 256  # smaller tiles to fill 132 SMs
    f32 = K.tile_default_config(1, 4096, 4096, 4096, 4)
    assert f32["BLOCK_K"] == 32
    for itemsize in (2, 4):
        for cfg in K.tile_configs(1, 4096, 4096, 4096, itemsize) + K.splitk_configs(1, 16, 8192, 8192, itemsize):
            assert K.smem_bytes(cfg, itemsize) <= K.SMEM_LIMIT, cfg
    assert big in K.tile_configs(1, 8192, 8192, 8192, 2)


def test_splitk_plan():
    cfg = K.splitk_default_config(1, 1, 8192, 8192, 2)
    assert cfg["BLOCK_M"] == 16 and cfg["SPLIT_K"] >= 2
    tiles = 8192 // cfg["BLOCK_N"]
    assert tiles * cfg["SPLIT_K"] >= 132
    # Short K: nothing to cut.
    assert K.splitk_default_config(1, 1, 8192, 256, 2)["SPLIT_K"] == 1


def test_int64_planning():
    class T:
        def __init__(self, shape, stride):
            self.shape, self._stride = shape, stride

        def stride(self):
            return self._stride

        def numel(self):
            n = 1
            for s in self.shape:
                n *= s
            return n

    assert not K.needs_int64(T((1, 4096, 4096), (0, 4096, 1)))
    assert K.needs_int64(T((1, 65536, 32768), (0, 32768, 1)))
    assert K.precision(F32, True) == "tf32" and K.precision(F32, False) == "ieee"
    assert K.precision(BF16, True) == "ieee"
