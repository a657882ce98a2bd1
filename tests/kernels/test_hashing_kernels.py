"""Hash table kernels under the Triton interpreter: the ``triton_hash``
variants run with small blocks (many programs), tight tables and a
degenerate hash that sends every key to slot 0 (every insert and probe walks
the collision chain). Oracles: a numpy equality matrix for joins and
``pandas.factorize`` for group-by, never opforge itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from opforge.kernels import hashing as K
from opforge.ops import hashing as H

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning"),
]

CONFIGS = {
    "default": K.default_config(0),
    "small_blocks": {"BLOCK": 16, "CAP_FACTOR": 2, "COLLIDE": 0},
    "tight_table": {"BLOCK": 32, "CAP_FACTOR": 1, "COLLIDE": 0},
    "all_collide": {"BLOCK": 16, "CAP_FACTOR": 1, "COLLIDE": 1},
}


def join_oracle(b, p, how, bv=None, pv=None):
    """All (build, probe) pairs from an equality matrix: probe-major, build ascending."""
    b, p = b.numpy().astype(np.int64), p.numpy().astype(np.int64)
    bv = np.ones(len(b), bool) if bv is None else bv.numpy()
    pv = np.ones(len(p), bool) if pv is None else pv.numpy()
    eq = (p[:, None] == b[None, :]) & pv[:, None] & bv[None, :]
    pi, bi = np.nonzero(eq)
    if how == "inner":
        return bi, pi
    has = eq.any(1)
    if how == "semi":
        rows = np.nonzero(has)[0]
        return (eq[rows].argmax(1) if len(rows) else np.empty(0, np.int64)), rows
    if how == "anti":
        rows = np.nonzero(~has)[0]
        return np.full(len(rows), -1), rows
    miss = np.nonzero(~has)[0]
    all_p = np.concatenate([pi, miss])
    all_b = np.concatenate([bi, np.full(len(miss), -1)])
    order = np.lexsort((all_b, all_p))
    return all_b[order], all_p[order]


def run_join(cfg, b, p, how, bv=None, pv=None):
    return H.JOIN.variant("triton_hash").run(cfg, b, p, how, bv, pv)


def check_join(cfg, b, p, how, bv=None, pv=None):
    out_b, out_p = run_join(cfg, b, p, how, bv, pv)
    want_b, want_p = join_oracle(b, p, how, bv, pv)
    assert out_b.dtype == out_p.dtype == torch.int64
    np.testing.assert_array_equal(out_p.numpy(), want_p)
    np.testing.assert_array_equal(out_b.numpy(), want_b)


def keys(gen, n, lo, hi, dtype=torch.int32):
    return torch.randint(lo, hi, (n,), generator=gen, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("cfg", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("how", H.HOWS)
def test_join_duplicates_both_sides(cfg, how, gen):
    scale = 3 if cfg == "all_collide" else 1  # every probe walks the whole chain there
    b = keys(gen, 300 // scale, -40, 40)
    p = keys(gen, 500 // scale, -60, 60)
    check_join(CONFIGS[cfg], b, p, how)


@pytest.mark.parametrize("cfg", ["small_blocks", "all_collide"])
@pytest.mark.parametrize("how", H.HOWS)
def test_join_nulls_never_match(cfg, how, gen):
    b = keys(gen, 120, 0, 30, torch.int64)
    p = keys(gen, 200, 0, 40, torch.int64)
    bv = torch.rand(120, generator=gen) > 0.3
    pv = torch.rand(200, generator=gen) > 0.3
    check_join(CONFIGS[cfg], b, p, how, bv, pv)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("cfg", ["tight_table", "all_collide"])
def test_join_extreme_keys(dtype, cfg, gen):
    info = torch.iinfo(dtype)
    special = torch.tensor([info.min, info.max, 0, -1, 1, info.min + 1, info.max - 1], dtype=dtype)
    b = torch.cat([special, special[:3], keys(gen, 50, -5, 5, dtype)])
    p = torch.cat([special.flip(0), keys(gen, 80, -8, 8, dtype), special[2:]])
    for how in H.HOWS:
        check_join(CONFIGS[cfg], b, p, how)


def test_join_keys_differing_in_high_bits_only(gen):
    """int64 keys equal in their low 32 bits must not match."""
    base = keys(gen, 64, 0, 1000, torch.int64)
    b = base + (torch.arange(64) << 32)
    p = torch.cat([base, b[::3]])
    for how in H.HOWS:
        check_join(CONFIGS["small_blocks"], b, p, how)


@pytest.mark.parametrize("how", H.HOWS)
def test_join_empty_and_disjoint(how, gen):
    cfg = CONFIGS["small_blocks"]
    e = torch.empty(0, dtype=torch.int32)
    p = keys(gen, 40, 0, 10)
    check_join(cfg, e, p, how)
    check_join(cfg, p, e, how)
    check_join(cfg, e, e, how)
    check_join(cfg, p, p + 100, how)  # no matches
    check_join(cfg, torch.full((5,), 3, dtype=torch.int32), torch.full((7,), 3, dtype=torch.int32), how)  # all


def test_join_mixed_key_dtypes(gen):
    b = keys(gen, 100, -20, 20, torch.int32)
    p = keys(gen, 150, -20, 20, torch.int64)
    p[0] = 1 << 40  # beyond int32: must not wrap onto a build key
    check_join(CONFIGS["small_blocks"], b, p, "inner")


def test_table_counts_and_first_rows(gen):
    """The build kernel's per-slot counts and first rows against numpy's unique."""
    k = keys(gen, 200, -30, 30, torch.int64)
    cfg = CONFIGS["all_collide"]
    log2cap, owner, tkeys, counts, firsts, slots = K.build_table(k, None, cfg, count=True, first=True)
    assert int((owner != 0).sum()) == len(np.unique(k.numpy()))
    assert torch.equal(tkeys[slots], k)  # each row's slot holds its key
    uniq, first, cnt = np.unique(k.numpy(), return_index=True, return_counts=True)
    slot_of = {int(v): int(s) for v, s in zip(k.tolist(), slots.tolist())}
    for v, f, c in zip(uniq, first, cnt):
        assert int(counts[slot_of[int(v)]]) == c
        assert int(firsts[slot_of[int(v)]]) == f


def group_oracle(k, v=None):
    s = pd.Series(k.numpy().astype(np.int64), dtype="Int64")
    if v is not None:
        s[~v.numpy()] = pd.NA
    codes, uniques = pd.factorize(s, use_na_sentinel=False)
    valid = ~pd.isna(uniques)
    return codes.astype(np.int64), np.where(valid, uniques.fillna(0).to_numpy(np.int64), 0), np.asarray(valid)


@pytest.mark.parametrize("cfg", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("nulls", [False, True])
def test_group_by(cfg, dtype, nulls, gen):
    info = torch.iinfo(dtype)
    n = 150 if cfg == "all_collide" else 400
    k = keys(gen, n, -25, 25, dtype)
    k[3], k[77], k[100] = info.min, info.max, info.min
    v = (torch.rand(n, generator=gen) > 0.25) if nulls else None
    gid, uk, uv = H.GROUP_BY.variant("triton_hash").run(CONFIGS[cfg], k, v)
    codes, uniques, valid = group_oracle(k, v)
    np.testing.assert_array_equal(gid.numpy(), codes)
    np.testing.assert_array_equal(uk.numpy().astype(np.int64), uniques)
    np.testing.assert_array_equal(uv.numpy(), valid)
    assert uk.dtype == dtype


def test_group_by_all_distinct_and_all_equal(gen):
    cfg = CONFIGS["small_blocks"]
    k = torch.randperm(300, generator=gen).to(torch.int64) * 7919 - 10**12
    gid, uk, _ = H.GROUP_BY.variant("triton_hash").run(cfg, k, None)
    assert torch.equal(gid, torch.arange(300)) and torch.equal(uk, k)
    gid, uk, _ = H.GROUP_BY.variant("triton_hash").run(cfg, torch.full((50,), -3), None)
    assert torch.equal(gid, torch.zeros(50, dtype=torch.int64)) and uk.tolist() == [-3]
    gid, uk, uv = H.GROUP_BY.variant("triton_hash").run(cfg, torch.empty(0, dtype=torch.int32), None)
    assert gid.numel() == uk.numel() == uv.numel() == 0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32])
def test_segment_reduce_extremes_small_blocks(dtype, gen):
    """Min/max reach the dtype's extremes (the identities the accumulators start
    from); many programs fold into the same few groups."""
    if dtype.is_floating_point:
        lo, hi = -3.0e38, 3.0e38
    else:
        lo, hi = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    v = torch.tensor([lo, hi, 0, 5, lo, hi, -7, 3] * 40, dtype=dtype)
    g = torch.randint(0, 6, (320,), generator=gen)
    v_np, g_np = v.numpy(), g.numpy()
    for op in ("min", "max", "count"):
        want = pd.Series(v_np).groupby(g_np).agg({"count": "size"}.get(op, op)).reindex(range(8), fill_value=0)
        for variant, cfg in (("triton_atomic", {"BLOCK": 16}), ("triton_private", {"BLOCK": 16, "PROGRAMS": 3})):
            out = H.SEGMENT_REDUCE.variant(variant).run(cfg, v, g, 8, op)
            np.testing.assert_array_equal(out.numpy(), want.to_numpy().astype(out.numpy().dtype))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.float64])
def test_segment_reduce_clustered_ids_fold_whole_blocks(dtype, gen):
    """Ids in runs (a stream's window numbers): runs longer than a block (one atomic per block),
    shorter ones (a block of mixed ids), a run of ids outside ``[0, num_groups)``, a run that is all
    NULL (its group stays empty), a ragged last block; the atomic kernel equals the reference."""
    runs = [(0, 70), (3, 5), (-1, 40), (2, 33), (9, 20), (5, 1), (4, 32), (2, 64), (7, 47)]
    g = torch.cat([torch.full((length,), i, dtype=torch.int64) for i, length in runs])
    v = (torch.randn(len(g), generator=gen) * 100).to(dtype)
    valid = torch.rand(len(g), generator=gen) > 0.2
    at = sum(length for _, length in runs[:6])
    valid[at:at + 32] = False  # the run of group 4
    for op in ("sum", "min", "max", "count"):
        for mask in (None, valid):
            out = H.SEGMENT_REDUCE.variant("triton_atomic").run({"BLOCK": 16}, v, g, 8, op, mask)
            ref = H.SEGMENT_REDUCE.reference(v, g, 8, op, mask)
            if op == "sum" and dtype.is_floating_point:  # atomics add in another order
                torch.testing.assert_close(out, ref.to(out.dtype), rtol=1e-5, atol=1e-3)
            else:
                assert torch.equal(out, ref.to(out.dtype)), (op, mask is None)
    assert H.SEGMENT_REDUCE.variant("triton_atomic").run({"BLOCK": 16}, v, g, 8, "count", valid)[4] == 0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32])
def test_segment_reduce_replicated_accumulators(dtype, gen):
    """Few groups over many rows at random: the atomic kernel adds into several copies of the groups
    (8 here) and folds them; ids outside the range and NULLs are skipped, as with one copy."""
    from opforge.kernels import hashing as K

    n, groups = 4000, 20
    assert K.replicas_for(n, groups) == 8
    g = torch.randint(-2, groups + 2, (n,), generator=gen)
    v = (torch.randn(n, generator=gen) * 1000).to(dtype)
    valid = torch.rand(n, generator=gen) > 0.1
    # blocks of 128: 32 programs (the last one ragged), 4 on each copy; the interpreter's time goes
    # by programs (blocks of 16 made 250 and took 7x longer for the same paths)
    for op in ("sum", "min", "max", "count"):
        for mask in (None, valid):
            out = H.SEGMENT_REDUCE.variant("triton_atomic").run({"BLOCK": 128}, v, g, groups, op, mask)
            ref = H.SEGMENT_REDUCE.reference(v, g, groups, op, mask)
            if op == "sum" and dtype.is_floating_point:
                torch.testing.assert_close(out, ref.to(out.dtype), rtol=1e-4, atol=1e-2)
            else:
                assert torch.equal(out, ref.to(out.dtype)), (op, mask is None)


def test_replicas_for_few_groups_and_many_rows_only():
    from opforge.kernels import hashing as K

    assert K.replicas_for(100_000_000, 1000) == K.MAX_REPLICAS
    assert K.replicas_for(10**9, 10**6) == 1  # the groups alone spread the atomics
    assert K.replicas_for(1000, 84) == 1  # too few rows to pay for the copies
    assert K.replicas_for(100, 0) == 1
    assert all(K.replicas_for(n, g) & (K.replicas_for(n, g) - 1) == 0 for n in (10**4, 10**6) for g in (3, 50, 700))


@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("heavy", [None, 0, 3])
def test_join_skewed_build_keys_heavy_rows(monkeypatch, how, heavy):
    """Build keys with many duplicates (key 0: 300 rows): probe rows past ``HEAVY_ROW_PAIRS``
    pairs are written by the output-parallel kernel (small blocks, so one row spans several
    programs and one program several rows); None writes every row in the row-parallel kernel."""
    monkeypatch.setattr(K, "HEAVY_ROW_PAIRS", heavy)
    monkeypatch.setattr(K, "HEAVY_BLOCK", 16)
    g = torch.Generator().manual_seed(5)
    b = torch.cat([torch.zeros(300, dtype=torch.int64), torch.full((40,), 7), torch.randint(-20, 20, (200,), generator=g)])
    b = b[torch.randperm(len(b), generator=g)]
    p = torch.randint(-25, 25, (150,), generator=g)
    pv = torch.rand(150, generator=g) > 0.1
    check_join(CONFIGS["small_blocks"], b, p, how, pv=pv)


@pytest.mark.parametrize("how", ["inner", "left"])
def test_join_with_at_most_one_match_per_probe_row_uses_the_slot_owner(monkeypatch, how):
    """A build side whose repeated keys no probe row meets still writes the right build rows
    through the one-match path (each matched slot holds one build row)."""
    calls = []
    real = K.probe_write_single
    monkeypatch.setattr(K, "probe_write_single", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(3)
    b = torch.cat([torch.randperm(60, generator=g), torch.full((5,), 500)])  # 500 repeats, never probed
    p = torch.randint(-10, 80, (120,), generator=g)
    check_join(CONFIGS["small_blocks"], b, p, how)
    assert calls == [1]
