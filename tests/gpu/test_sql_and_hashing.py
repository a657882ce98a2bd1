"""The relational kernels and the SQL engine on a real GPU (the interpreter runs
programs one at a time; atomics and the engine's device code paths need CUDA).
Skipped without CUDA; run with ``OPFORGE_INTERPRET=0 python3 -m pytest tests/gpu``."""

import os

import pandas as pd
import pytest
import torch

import opforge

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("OPFORGE_INTERPRET") == "1",
    reason="needs a CUDA device (and OPFORGE_INTERPRET=0)",
)


@pytest.mark.parametrize("how", ["inner", "left", "semi", "anti"])
def test_hash_join_matches_pandas_merge(how):
    g = torch.Generator(device="cuda").manual_seed(7)
    build = torch.randint(-50_000, 50_000, (200_000,), device="cuda", generator=g, dtype=torch.int32)
    probe = torch.randint(-50_000, 50_000, (1_000_000,), device="cuda", generator=g, dtype=torch.int32)
    d = opforge.explain("hash_join", build, probe, how)
    assert d.variant.name == "triton_hash", d
    bi, pi = opforge.hash_join(build, probe, how=how)
    b = pd.DataFrame({"k": build.cpu().numpy(), "bi": range(build.numel())})
    p = pd.DataFrame({"k": probe.cpu().numpy(), "pi": range(probe.numel())})
    if how in ("inner", "left"):
        m = p.merge(b, on="k", how=how).fillna({"bi": -1}).astype({"bi": "int64"})
        want = sorted(zip(m.pi, m.bi))
        assert sorted(zip(pi.tolist(), bi.tolist())) == want, d
    else:
        hit = p.k.isin(b.k)
        want = p.pi[hit if how == "semi" else ~hit].tolist()
        assert pi.tolist() == want, d


def test_group_by_and_segment_sum_match_pandas():
    keys = torch.randint(0, 10_000, (3_000_000,), device="cuda")
    vals = torch.randn(3_000_000, device="cuda", dtype=torch.float64)
    gid, uk = opforge.group_by(keys)
    sums = opforge.segment_reduce(vals, gid, uk.numel(), "sum")
    want = pd.Series(vals.cpu().numpy()).groupby(keys.cpu().numpy()).sum()
    got = pd.Series(sums.cpu().numpy(), index=uk.cpu().numpy()).sort_index()
    assert (got.index == want.index).all()
    assert ((got - want).abs() <= 1e-9 * (1 + want.abs())).all()


@pytest.mark.parametrize("n", [1, 3, 6, 10, 18])
def test_tpch_queries_on_the_gpu_match_duckdb(n, tmp_path_factory):
    from opforge.sql.tpch import compare, data, queries, reference

    paths = data.generate(0.01, root=tmp_path_factory.getbasetemp() / "tpch")
    con = opforge.connect(device="cuda")
    for name, path in paths.items():
        con.register(name, str(path))
    text = queries.query(n)
    ours = con.sql(text).to_arrow()
    ref = reference.run(reference.connect(paths)[0], text)
    keys = compare.order_keys(text)
    assert compare.compare(ours, ref, ordered=keys is not None, order_by=keys) == []
