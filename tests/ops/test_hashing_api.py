"""The hash ops' contract: registry and dispatch, torch.library registration,
semantics against pandas (merge, isin, factorize), NULL keys, every ``how``,
output order, the selftest samples, and error messages.

Oracles are pandas / numpy, never opforge itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import opforge.ops.hashing as H
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]

VARIANTS = ("triton_hash", "reference")


def keys(gen, n, lo, hi, dtype=torch.int32):
    return torch.randint(lo, hi, (n,), generator=gen, dtype=torch.int64).to(dtype)


def pandas_join(b, p, how, bv=None, pv=None):
    """pandas merge on the non-NULL rows, sorted by (probe row, build row)."""
    bdf = pd.DataFrame({"k": b.numpy().astype(np.int64), "bi": np.arange(len(b))})
    pdf = pd.DataFrame({"k": p.numpy().astype(np.int64), "pi": np.arange(len(p))})
    if bv is not None:
        bdf = bdf[bv.numpy()]
    pdf_valid = pdf if pv is None else pdf[pv.numpy()]
    inner = pdf_valid.merge(bdf, on="k", how="inner").sort_values(["pi", "bi"])
    matched = pdf["pi"].isin(inner["pi"])
    if how == "inner":
        return inner["bi"].to_numpy(), inner["pi"].to_numpy()
    if how == "semi":
        first = inner.groupby("pi")["bi"].min()
        return first.to_numpy(), first.index.to_numpy()
    if how == "anti":
        rows = pdf["pi"][~matched].to_numpy()
        return np.full(len(rows), -1), rows
    misses = pd.DataFrame({"pi": pdf["pi"][~matched], "bi": -1})
    both = pd.concat([inner[["pi", "bi"]], misses]).sort_values(["pi", "bi"])
    return both["bi"].to_numpy(), both["pi"].to_numpy()


def assert_join(out, want):
    np.testing.assert_array_equal(out[1].numpy(), want[1])
    np.testing.assert_array_equal(out[0].numpy(), want[0])


# ---------------------------------------------------------------------------
# Registry and dispatch
# ---------------------------------------------------------------------------
def test_registered_with_variants():
    for name in ("hash_join", "group_by"):
        op = registry.get(f"opforge::{name}")
        assert [v.name for v in op.variants] == ["triton_hash", "torch_sort", "reference"]
        assert op.variant("torch_sort").kind == "vendor" and op.variant("reference").kind == "reference"


def test_interpreter_dispatches_to_triton(gen):
    b, p = keys(gen, 10, 0, 5), keys(gen, 10, 0, 5)
    d = dispatch.explain("hash_join", b, p, "inner", None, None)
    assert d.variant.name == "triton_hash"
    assert "torch_sort" in d.rejected
    assert dispatch.explain("group_by", b, None).variant.name == "triton_hash"


# ---------------------------------------------------------------------------
# Semantics against pandas
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("how", H.HOWS)
@pytest.mark.parametrize("nulls", [False, True])
def test_join_matches_pandas(variant, how, nulls, gen):
    b = keys(gen, 700, -100, 100, torch.int64)
    p = keys(gen, 900, -150, 150, torch.int64)
    bv = (torch.rand(700, generator=gen) > 0.2) if nulls else None
    pv = (torch.rand(900, generator=gen) > 0.2) if nulls else None
    with force_variant("hash_join", variant):
        out = H.hash_join(b, p, how=how, build_valid=bv, probe_valid=pv)
    assert_join(out, pandas_join(b, p, how, bv, pv))


@pytest.mark.parametrize("variant", VARIANTS)
def test_join_unique_build_keys_half_hit(variant, gen):
    """The bench's shape in small: unique build keys, about half the probes hit."""
    b = torch.randperm(2000, generator=gen).to(torch.int32) * 2
    p = keys(gen, 3000, 0, 4000)
    with force_variant("hash_join", variant):
        out = H.hash_join(b, p)
    assert_join(out, pandas_join(b, p, "inner"))
    assert 0.4 < out[0].numel() / 3000 < 0.6


@pytest.mark.parametrize("variant", VARIANTS)
def test_join_extremes_int32(variant):
    lo, hi = -(2**31), 2**31 - 1
    b = torch.tensor([lo, hi, hi, 0, lo], dtype=torch.int32)
    p = torch.tensor([hi, 1, lo, lo, 0], dtype=torch.int32)
    with force_variant("hash_join", variant):
        for how in H.HOWS:
            assert_join(H.hash_join(b, p, how=how), pandas_join(b, p, how))


def test_join_documented_example():
    b = torch.tensor([5, 7, 5])
    p = torch.tensor([7, 9, 5])
    bi, pi = H.hash_join(b, p)
    assert bi.tolist() == [1, 0, 2] and pi.tolist() == [0, 2, 2]
    bi, pi = H.hash_join(b, p, how="left")
    assert bi.tolist() == [1, -1, 0, 2] and pi.tolist() == [0, 1, 2, 2]
    assert H.hash_join(b, p, how="semi")[1].tolist() == [0, 2]
    assert H.hash_join(b, p, how="semi")[0].tolist() == [1, 0]
    assert H.hash_join(b, p, how="anti")[1].tolist() == [1]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("nulls", [False, True])
def test_group_by_matches_pandas_factorize(variant, nulls, gen):
    k = keys(gen, 1500, -300, 300, torch.int64)
    v = (torch.rand(1500, generator=gen) > 0.1) if nulls else None
    with force_variant("group_by", variant):
        out = H.group_by(k, v)
    s = pd.Series(k.numpy(), dtype="Int64")
    if nulls:
        s[~v.numpy()] = pd.NA
    codes, uniques = pd.factorize(s, use_na_sentinel=False)
    assert len(out) == (3 if nulls else 2)
    np.testing.assert_array_equal(out[0].numpy(), codes)
    np.testing.assert_array_equal(out[1].numpy(), uniques.fillna(0).to_numpy(np.int64))
    if nulls:
        np.testing.assert_array_equal(out[2].numpy(), ~pd.isna(uniques))


def test_group_by_then_sum_matches_pandas_groupby(gen):
    """How the SQL engine aggregates: ids, then a scatter-add by id."""
    k = keys(gen, 1000, 0, 50)
    x = torch.randn(1000, generator=gen, dtype=torch.float64)
    gid, uk = H.group_by(k)
    sums = torch.zeros(uk.numel(), dtype=torch.float64).index_add_(0, gid, x)
    want = pd.Series(x.numpy()).groupby(k.numpy(), sort=False).sum()
    np.testing.assert_array_equal(uk.numpy(), want.index.to_numpy())
    np.testing.assert_allclose(sums.numpy(), want.to_numpy(), rtol=1e-12)


def test_samples_agree_with_reference():
    """The selftest samples: the Triton variant equals the reference on each."""
    cpu = torch.device("cpu")
    for op, samples in ((H.JOIN, H.join_samples(cpu)[1::11] + H.join_samples(cpu)[-2:]),
                        (H.GROUP_BY, H.group_by_samples(cpu)[3::4]),
                        (H.SEGMENT_REDUCE, H.segment_samples(cpu)[::5])):
        for args in samples:
            v = next(v for v in op.variants if v.check(*args) is None)
            out = v.run(dict(v.default_config(*args), BLOCK=2048), *args)  # fewer interpreted programs
            ref = op.reference(*args)
            for a, r in zip(out, ref) if isinstance(out, tuple) else ((out, ref),):
                assert torch.equal(a, r), (op.name, [getattr(t, "shape", t) for t in args])


# ---------------------------------------------------------------------------
# torch.library
# ---------------------------------------------------------------------------
def test_torch_library_ops(gen):
    b, p = keys(gen, 30, 0, 8), keys(gen, 40, 0, 8)
    bi, pi = torch.ops.opforge.hash_join(b, p, "inner", None, None)
    assert_join((bi, pi), pandas_join(b, p, "inner"))
    gid, uk, uv = torch.ops.opforge.group_by(b, None)
    codes, uniques = pd.factorize(b.numpy())
    np.testing.assert_array_equal(gid.numpy(), codes)
    assert uv.all()


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def test_errors_name_op_and_argument():
    k = torch.arange(4)
    with pytest.raises(TypeError, match=r"opforge.hash_join: build_keys must be int32 or int64"):
        H.hash_join(k.float(), k)
    with pytest.raises(ValueError, match=r"opforge.hash_join: probe_keys must be 1-D"):
        H.hash_join(k, k.reshape(2, 2))
    with pytest.raises(ValueError, match=r"how must be one of"):
        H.hash_join(k, k, how="outer")
    with pytest.raises(TypeError, match=r"probe_valid must be a bool tensor"):
        H.hash_join(k, k, probe_valid=torch.ones(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"build_valid has shape \(3,\)"):
        H.hash_join(k, k, build_valid=torch.ones(3, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"opforge.group_by: keys must be a torch.Tensor"):
        H.group_by([1, 2])
    with pytest.raises(TypeError, match=r"opforge.group_by: keys must be int32 or int64"):
        H.group_by(torch.ones(3, dtype=torch.int16))


# ---------------------------------------------------------------------------
# segment_reduce
# ---------------------------------------------------------------------------
def pandas_segment(values, gid, num_groups, op, valid=None):
    df = pd.DataFrame({"v": values.numpy(), "g": gid.numpy()})
    if valid is not None:
        df = df[valid.numpy()]
    df = df[(df.g >= 0) & (df.g < num_groups)]
    agg = df.groupby("g")["v"].agg({"count": "size"}.get(op, op))
    return agg.reindex(range(num_groups), fill_value=0).to_numpy()


@pytest.mark.parametrize("variant", ("triton_private", "triton_atomic", "reference"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
@pytest.mark.parametrize("op", H.SEGMENT_OPS)
def test_segment_reduce_matches_pandas(variant, dtype, op, gen):
    n, G = 1200, (5 if variant == "triton_private" else 90)
    if dtype.is_floating_point:
        values = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    else:
        values = torch.randint(-10**6, 10**6, (n,), generator=gen).to(dtype)
    gid = torch.randint(-3, G + 10, (n,), generator=gen)  # some ids out of range: skipped
    valid = torch.rand(n, generator=gen) > 0.2
    with force_variant("segment_reduce", variant):  # the unchecked entry: the public one raises for them
        out = H.segment_reduce_dense(values, gid, G, op, valid=valid)
    want = pandas_segment(values, gid, G, op, valid)
    assert out.dtype == H.segment_out_dtype(values, op) and out.shape == (G,)
    if dtype.is_floating_point and op == "sum":  # pandas adds in another order
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        np.testing.assert_allclose(out.numpy(), want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(out.numpy(), want.astype(out.numpy().dtype))


def test_segment_reduce_deterministic_floats(gen):
    values = torch.randn(3000, generator=gen) * 1e3
    gid = torch.randint(0, 7, (3000,), generator=gen)
    d = dispatch.explain("segment_reduce", values, gid, 7, "sum", None, True)
    assert d.variant.name == "reference"
    assert dispatch.explain("segment_reduce", values, gid, 7, "sum", None, False).variant.name == "triton_private"
    assert dispatch.explain("segment_reduce", values, gid.clamp(max=6) * 9, 60, "sum", None,
                            False).variant.name == "triton_atomic"  # too many groups to hold privately
    out = H.segment_reduce(values, gid, 7, deterministic=True)
    want = pd.Series(values.double().numpy()).groupby(gid.numpy()).sum().to_numpy()
    np.testing.assert_array_equal(out.numpy(), want.astype(np.float32))  # fp64 sum, rounded once


def test_segment_reduce_errors():
    v, g = torch.ones(4), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"opforge.segment_reduce: group_ids must be an int64 tensor"):
        H.segment_reduce(v, g.int(), 2)
    with pytest.raises(ValueError, match=r"op must be one of"):
        H.segment_reduce(v, g, 2, "mean")
    with pytest.raises(ValueError, match=r"num_groups must be an int >= 0"):
        H.segment_reduce(v, g, -1)
    with pytest.raises(TypeError, match=r"values must be float32, float64, int32 or int64"):
        H.segment_reduce(v.half(), g, 2)


def test_segment_reduce_rejects_ids_out_of_range_and_unequal_lengths():
    """Issue 25: ids outside [0, num_groups) and a group_ids of another length
    raise (before: dropped silently; the length was checked once per memo key,
    whose key holds only the rows' magnitude)."""
    v, g = torch.ones(6), torch.tensor([0, 1, 2, 0, 1, 2])
    assert H.segment_reduce(v, g, 3).tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match=r"opforge.segment_reduce: group_ids must lie in \[0, 3\), got ids from 0 to 3"):
        H.segment_reduce(v, g + (g == 2).long(), 3)
    with pytest.raises(ValueError, match=r"opforge.segment_reduce: group_ids must lie in \[0, 3\), got ids from -1 to 2"):
        H.segment_reduce(v, g - (g == 0).long(), 3, "count")
    with pytest.raises(ValueError, match=r"opforge.segment_reduce: values and group_ids must be 1-D of one length, "
                                         r"got \(6,\) and \(7,\)"):
        H.segment_reduce(v, torch.zeros(7, dtype=torch.int64), 3)  # same memo key as the first call
    with pytest.raises(ValueError, match=r"opforge.segment_reduce: group_ids must lie in \[0, 2\)"):
        torch.ops.opforge.segment_reduce(v, g, 2, "sum", None, False)
    # a NULL row is marked by valid=, whatever its id holds in range
    assert H.segment_reduce(v, g, 3, valid=g != 1).tolist() == [2.0, 0.0, 2.0]


def test_segment_reduce_dense_skips_the_range_check():
    """The engines' entry: ids in range by construction (group_by), no host sync;
    ids out of range are still never written out of bounds."""
    v, g = torch.ones(6), torch.tensor([0, 1, 2, 0, 1, 5])
    assert H.segment_reduce_dense(v, g, 3).tolist() == [2.0, 2.0, 1.0]
    with pytest.raises(ValueError, match=r"opforge.segment_reduce: values and group_ids must be 1-D of one length"):
        H.segment_reduce_dense(v, g[:5], 3)
