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


@pytest.mark.parametrize("n", [1, 2, 3, 6, 10, 13, 17, 18, 21, 22])
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


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["sum", "min", "max", "count"])
def test_private_segment_reduce_matches_the_reference_with_few_groups(dtype, op):
    """The private-accumulator variant (≤ 32 groups, as TPC-H q1's 4 groups over 59M rows)."""
    from opforge.ops import hashing as H
    from opforge.runtime.dispatch import force_variant

    g = torch.Generator(device="cuda").manual_seed(3)
    n = 5_000_000
    values = (torch.randint(-10**6, 10**6, (n,), device="cuda", generator=g).to(dtype) if not dtype.is_floating_point
              else torch.randn(n, device="cuda", generator=g, dtype=torch.float64).to(dtype))
    for groups in (1, 4, 32):
        gid = torch.randint(-1, groups + 1, (n,), device="cuda", generator=g)
        valid = torch.rand(n, device="cuda", generator=g) > 0.1
        assert opforge.explain("segment_reduce", values, gid, groups, op, valid, False).variant.name == "triton_private"
        with force_variant("segment_reduce", "triton_private"):
            got = H.segment_reduce_dense(values, gid, groups, op, valid=valid)  # ids out of range: skipped
        want = H.SEGMENT_REDUCE.reference(values, gid, groups, op, valid)
        if dtype.is_floating_point and op == "sum":
            torch.testing.assert_close(got.double(), want.double(), rtol=1e-5 if dtype == torch.float32 else 1e-12,
                                       atol=1e-3)
        else:
            assert torch.equal(got, want), (groups, op)


def test_like_on_the_device_dictionary_matches_python():
    """``sql.strings.like`` over a dictionary's bytes on the GPU, against Python's ``re``."""
    import random
    import re

    import pyarrow as pa

    from opforge.sql import strings

    rng = random.Random(9)
    words = sorted({"".join(rng.choice("ab c") for _ in range(rng.randint(0, 30))) for _ in range(50_000)})
    dw = strings.from_arrow(pa.array(words, pa.string()), "cuda")
    for pattern in ["%ab%c%", "a%", "%b", "a_c%", "%a b%ab%", "", "%", "abc"]:
        rx = re.compile("".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern), re.DOTALL)
        assert strings.like(dw, pattern).tolist() == [rx.fullmatch(w) is not None for w in words], pattern


def test_fused_cross_entropy_backward_rescales_on_the_device():
    """loss.backward() of the public cross_entropy hands the fused pass's gradient back with no
    host sync; a scaled loss rescales it in place; both equal torch's."""
    import torch.nn.functional as F

    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(4096, 32000, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
    t = torch.randint(0, 32000, (4096,), device="cuda", generator=g)
    for scale in (1.0, 64.0):
        x.grad = None
        (opforge.cross_entropy(x, t) * scale).backward()
        xr = x.detach().float().requires_grad_()
        (F.cross_entropy(xr, t) * scale).backward()
        torch.testing.assert_close(x.grad.float(), xr.grad, rtol=2e-2, atol=1e-5 * scale)


@pytest.mark.parametrize("case", ["unique_build", "skewed_build"])
def test_hash_join_one_match_and_heavy_rows_paths_match_torch_sort(case):
    """Unique build keys take the one-match path (the slot's owner); a Zipf build side sends rows
    with many matches to the output-parallel kernel. Both against the sort-based variant."""
    import numpy as np

    from opforge.kernels import hashing as K
    from opforge.runtime.dispatch import force_variant

    rng = np.random.default_rng(3)
    if case == "unique_build":
        build = torch.tensor(rng.permutation(2_000_000), device="cuda")
    else:
        build = torch.tensor((rng.zipf(1.2, 200_000) - 1) % 50_000, device="cuda")
        assert int(torch.bincount(build).max()) > K.HEAVY_ROW_PAIRS
    probe = torch.tensor(rng.integers(0, 2_000_000 if case == "unique_build" else 50_000, 3_000_000), device="cuda")
    for how in ("inner", "left"):
        with force_variant("hash_join", "triton_hash"):
            got = opforge.hash_join(build, probe, how=how)
        with force_variant("hash_join", "torch_sort"):
            want = opforge.hash_join(build, probe, how=how)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), how


def test_short_substring_on_the_device_matches_python():
    import random

    import pyarrow as pa

    from opforge.sql import strings

    rng = random.Random(2)
    words = sorted({f"{rng.randint(10, 34)}-{rng.randint(100, 999)}-{rng.randint(0, 10**6)}" for _ in range(60_000)})
    dw = strings.from_arrow(pa.array(words, pa.string()), "cuda")
    for begin, length in [(0, 2), (3, 3), (0, 7)]:
        codes, new = strings.short_substring(dw, begin, length)
        want = [w[begin:begin + length] for w in words]
        assert list(new) == sorted(set(want))
        assert [new[c] for c in codes.tolist()] == want

