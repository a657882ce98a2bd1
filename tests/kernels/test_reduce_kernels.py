"""Reduction kernels under the Triton interpreter: each variant forced (or run
directly with small tiles and several splits, so a few hundred elements cross
many blocks and chunks); the oracle is torch in float64.
"""

from __future__ import annotations

import pytest
import torch

from opforge.bench.case import rel_err
from opforge.kernels import reduce as K
from opforge.ops import reduce as R
from opforge.runtime import dispatch
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
BOUND = {F32: 1e-5, BF16: 1e-2, F16: 1e-3, F64: 1e-12}
FLOAT_OPS = ("sum", "mean", "amax", "amin", "var", "std")
ARG_OPS = ("argmax", "argmin")
SMALL = {"BLOCK_M": 2, "BLOCK_N": 16, "BLOCK_R": 4, "BLOCK_I": 8, "num_warps": 1}

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]


def rand(shape, gen, dtype=F32, scale=3.0, shift=0.5):
    return (torch.randn(shape, generator=gen, dtype=F64) * scale + shift).to(dtype)


def args_for(name, x, dims, keepdim=False):
    return (x, dims, 1.0, keepdim) if name in ("var", "std") else (x, dims, keepdim)


def oracle(name, x, dims, keepdim=False):
    """torch in float64 (arg ops on the original values: ties stay ties)."""
    if name in ARG_OPS:
        return R.REFERENCE[name](x, dims, keepdim)
    return R.REFERENCE[name](x.double(), dims, *args_for(name, x, dims, keepdim)[2:])


def check(name, out, x, dims, keepdim=False):
    want = oracle(name, x, dims, keepdim)
    assert out.shape == want.shape
    if name in ARG_OPS:
        assert out.dtype == torch.int64 and torch.equal(out, want)
        return
    assert out.dtype == x.dtype
    err = rel_err(out, want)
    assert err <= BOUND[x.dtype], err


# ---------------------------------------------------------------------------
# Each layout variant, each float dtype, every op
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, BF16, F16, F64], ids=str)
@pytest.mark.parametrize("name", FLOAT_OPS + ARG_OPS)
def test_rows_and_cols_match_float64(name, dtype, gen):
    x = rand((6, 50), gen, dtype)
    check(name, R.OPS[name].variant("triton_rows").run(SMALL, *args_for(name, x, (1,))), x, (1,))
    check(name, R.OPS[name].variant("triton_cols").run(SMALL, *args_for(name, x, (0,))), x, (0,))


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("name", FLOAT_OPS + ARG_OPS)
def test_two_pass_split_rows_cols_and_full(name, dtype, gen):
    v = R.OPS[name].variant("triton_split_two_pass")
    for shape, dims in (((3, 120), (1,)), ((100, 5), (0,)), ((2, 60, 3), (1,)), ((7, 43), ())):
        x = rand(shape, gen, dtype)
        check(name, v.run({**SMALL, "SPLIT": 5}, *args_for(name, x, dims)), x, dims)


@pytest.mark.parametrize("name", sorted(K.ATOMIC_OPS))
def test_atomic_split_matches_float64(name, gen):
    v = R.OPS[name].variant("triton_split_atomic")
    for shape, dims in (((3, 120), (1,)), ((100, 5), (0,)), ((7, 43), ())):
        x = rand(shape, gen)
        check(name, v.run({**SMALL, "SPLIT": 6}, x, dims, False), x, dims)


@pytest.mark.parametrize("name", ["amax", "amin"])
def test_atomic_extremes_propagate_nan_and_inf(name, gen):
    v = R.OPS[name].variant("triton_split_atomic")
    x = rand((4, 100), gen)
    x[0, 90] = float("nan")
    x[1, 3] = -float("nan")  # a negative NaN must win too
    x[2, 77] = float("inf")
    x[3, 60] = -float("inf")
    out = v.run({**SMALL, "SPLIT": 6}, x, (1,), False)
    want = getattr(torch, name)(x, 1)
    assert torch.equal(out.isnan(), want.isnan()) and torch.equal(out[2:], want[2:])


def test_two_pass_values_and_indices_in_one_pass(gen):
    x = rand((3, 100), gen)
    v = R.OPS["argmax"].variant("triton_split_two_pass")
    vals, idx = v.run({**SMALL, "SPLIT": 4}, x, (1,), False, True)
    want = torch.max(x, 1)
    assert torch.equal(vals, want.values) and torch.equal(idx, want.indices)


# ---------------------------------------------------------------------------
# NaN, infinities, ties
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["triton_rows", "triton_cols", "triton_split_two_pass"])
@pytest.mark.parametrize("name", ["amax", "amin", "argmax", "argmin", "sum", "var"])
def test_nan_inf_as_torch(name, variant, gen):
    x = rand((6, 80), gen)
    x[0, 0] = float("nan")  # NaN first
    x[1, 79] = float("nan")  # NaN last (a later chunk)
    x[1, 30] = float("nan")  # two NaNs: the first index wins
    x[2, :] = float("-inf")
    x[3, 40] = float("inf")
    x[4, 10] = float("inf")
    x[4, 11] = float("-inf")
    if variant == "triton_cols":
        x = x.t().contiguous().t()  # the reduced axis strided, inner contiguous
        x, dims = x.t(), (0,)
    else:
        dims = (1,)
    out = R.OPS[name].variant(variant).run({**SMALL, "SPLIT": 4}, *args_for(name, x, dims))
    want = oracle(name, x, dims)
    if name in ARG_OPS:
        assert torch.equal(out, want)
    else:
        assert torch.equal(out.isnan(), want.isnan())
        fin = ~want.isnan()
        torch.testing.assert_close(out[fin].double(), want[fin], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["triton_rows", "triton_split_two_pass"])
@pytest.mark.parametrize("name", ARG_OPS)
def test_ties_go_to_first_index_across_chunks(name, variant):
    x = torch.zeros(3, 120)
    x[0, [40, 90, 110]] = 5.0 if name == "argmax" else -5.0
    x[1] = 1.0  # all equal: index 0
    x[2, [119, 60]] = 5.0 if name == "argmax" else -5.0
    out = R.OPS[name].variant(variant).run({**SMALL, "SPLIT": 5}, x, (1,), False)
    assert out.tolist() == [40, 0, 60]


# ---------------------------------------------------------------------------
# Integers and bool, dtype=
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool], ids=str)
@pytest.mark.parametrize("variant", ["triton_rows", "triton_cols", "triton_split_two_pass"])
def test_integer_reductions_exact(variant, dtype, gen):
    hi = 2 if dtype == torch.bool else 100
    x = torch.randint(0, hi, (5, 50), generator=gen).to(dtype)
    if dtype in (torch.int32, torch.int64):
        x = x * 30_000_000 - 10  # int32 sums overflow int32: torch sums in int64
    x, dims = (x.t(), (0,)) if variant == "triton_cols" else (x, (1,))
    cfg = {**SMALL, "SPLIT": 3}
    for name in ("sum", "amax", "amin") + (() if dtype == torch.bool else ARG_OPS):
        out = R.OPS[name].variant(variant).run(cfg, x, dims, False)
        want = R.REFERENCE[name](x, dims, False)
        assert out.dtype == want.dtype and torch.equal(out, want), name


def test_sum_dtype_argument_casts_first(gen):
    x = rand((4, 60), gen, F32, 100.0)
    for variant in ("triton_rows", "triton_split_two_pass"):
        v = R.OPS["sum"].variant(variant)
        out = v.run({**SMALL, "SPLIT": 3}, x, (1,), False, torch.int64)
        assert out.dtype == torch.int64 and torch.equal(out, torch.sum(x, 1, dtype=torch.int64))
        out = v.run({**SMALL, "SPLIT": 3}, x, (1,), False, F64)
        assert out.dtype == F64 and rel_err(out, torch.sum(x.double(), 1)) < 1e-12
        m = R.OPS["mean"].variant(variant).run({**SMALL, "SPLIT": 3}, x.to(BF16), (1,), False, F32)
        assert m.dtype == F32 and rel_err(m, x.to(BF16).double().mean(1)) < 1e-6


# ---------------------------------------------------------------------------
# var/std: stability, correction
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["triton_rows", "triton_cols", "triton_split_two_pass"])
def test_var_is_stable_with_a_large_mean(variant, gen):
    x = rand((3, 200), gen, F32, scale=1.0, shift=1e4)
    x, dims = (x.t(), (0,)) if variant == "triton_cols" else (x, (1,))
    out = R.OPS["var"].variant(variant).run({**SMALL, "SPLIT": 7}, x, dims, 1.0, False)
    # sum(x^2)/n - mean^2 in fp32 has an error near 100% here.
    assert rel_err(out, torch.var(x.double(), dims[0])) < 1e-5


@pytest.mark.parametrize("correction", [0.0, 1.0, 2.5, 5.0, 8.0])
def test_var_correction_and_nonpositive_dof(correction, gen):
    x = rand((3, 5), gen)
    for variant in ("triton_rows", "triton_split_two_pass"):
        for name in ("var", "std"):
            out = R.OPS[name].variant(variant).run({**SMALL, "SPLIT": 2}, x, (1,), correction, False)
            want = getattr(torch, name)(x.double(), 1, correction=correction)
            assert torch.equal(out.isinf(), want.isinf()) and torch.equal(out.isnan(), want.isnan())
            fin = want.isfinite()
            torch.testing.assert_close(out[fin].double(), want[fin], rtol=1e-5, atol=0)


# ---------------------------------------------------------------------------
# Layouts: strided, permuted, expanded, copy fallback, output reorder, 64-bit offsets
# ---------------------------------------------------------------------------
def test_layouts_views_and_fallbacks(gen):
    base = rand((6, 5, 8), gen)
    cases = [
        (base[:, :, ::2], (2,)),  # strided reduced axis (rows, stride 2)
        (base.permute(2, 0, 1), (1,)),  # kept dims out of logical order: output reordered
        (base.permute(1, 2, 0), (0, 2)),  # interleaved: permute + copy
        (base[:1].expand(4, 5, 8), (0,)),  # stride 0
        (base, (0, 2)),  # reduced dims around a kept one
        (base.transpose(0, 2), ()),  # full reduction of a transposed input
    ]
    copies = 0
    for x, dims in cases:
        p = R.plan_of(x, dims, "sum")
        copies += p.copy_perm is not None
        for name in ("sum", "amax", "var"):
            with force_variant(name, "triton_cols" if p.geom[2] > 1 else "triton_rows"):
                out = dispatch.call(R.OPS[name], *args_for(name, x, dims))
            check(name, out, x, dims)
            assert out.is_contiguous()
    assert copies == 1
    assert not R.plan_of(base.permute(2, 0, 1), (1,), "sum").direct


def test_flattened_argmax_of_a_transposed_input(gen):
    x = rand((9, 13), gen).t()
    for variant in ("triton_rows", "triton_split_two_pass"):
        out = R.OPS["argmax"].variant(variant).run({**SMALL, "SPLIT": 3}, x, (), False)
        assert int(out) == int(torch.argmax(x))


def test_int64_offsets_path(gen, monkeypatch):
    """Force the 64-bit offset kernels (a 2^31-element tensor does not fit the interpreter)."""
    monkeypatch.setattr(K, "_INT32_MAX", 50)
    x = rand((6, 40), gen)
    for name in ("sum", "argmax", "var"):
        for variant, xx, dims in (("triton_rows", x, (1,)), ("triton_cols", x, (0,)),
                                  ("triton_split_two_pass", x, (1,))):
            check(name, R.OPS[name].variant(variant).run({**SMALL, "SPLIT": 3}, *args_for(name, xx, dims)), xx, dims)


def test_split_count_fills_the_gpu():
    cfg = K.rows_default_config(64, 1 << 20, 4)
    s = K.split_count((64, 1 << 20, 1), cfg)
    assert 64 * s >= K.FILL_PROGRAMS and (1 << 20) // s >= 4 * cfg["BLOCK_N"]
    assert K.split_count((32768, 8192, 1), K.rows_default_config(32768, 8192, 2)) == 1
    cfg = K.cols_default_config(32768, 8192, 2)
    assert K.programs((1, 32768, 8192), cfg) * K.split_count((1, 32768, 8192), cfg) >= K.FILL_PROGRAMS
    assert K.split_count((1, 100, 1), K.rows_default_config(1, 100)) == 1
