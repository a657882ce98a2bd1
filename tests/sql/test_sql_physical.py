"""Physical operators: every join algorithm (hash, sort-merge, nested loop) and kind against DuckDB on
tables with NULL keys, duplicates, Zipf skew, empty inputs, all-match and no-match; the algorithm rule;
radix partitioning under a memory budget equal to the unpartitioned answer; top-k identical to
sort + limit; hash aggregation through segment_reduce."""
import numpy as np
import pyarrow as pa
import pytest
import torch

import opforge.sql as sql
from opforge.sql.column import Column
from opforge.sql import types as T
from opforge.sql.expr import Batch, Ref
from opforge.sql.physical import keys as K
from opforge.sql.physical.join import choose_algorithm, join_pairs
from opforge.sql.physical.sort import sort_permutation
from opforge.sql.physical.topk import candidates, run_topk
from opforge.sql.plan import TopK
from sql_reference import SqlCheck, random_table


def _side(rng, n, keys, prefix, zipf=False, null_frac=0.15):
    k = (rng.zipf(1.4, n) % keys) if zipf else rng.integers(0, keys, n)
    return pa.table({
        f"{prefix}k": pa.array(k.astype(np.int32), mask=rng.random(n) < null_frac),
        f"{prefix}k2": pa.array(rng.integers(0, 3, n).astype(np.int64)),
        f"{prefix}w": pa.array([["x", "y", "z"][j] for j in rng.integers(0, 3, n)], pa.string()),
        f"{prefix}v": pa.array(rng.integers(0, 100, n).astype(np.int32)),
    })


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(21)
    return {
        "a": _side(rng, 80, 12, "a"), "b": _side(rng, 60, 12, "b"),
        "z": _side(rng, 70, 30, "b", zipf=True),
        "e": _side(rng, 0, 5, "b"),
        "miss": pa.table({"bk": pa.array([500, 501], pa.int32()), "bk2": pa.array([0, 1], pa.int64()),
                          "bw": pa.array(["x", "y"]), "bv": pa.array([1, 2], pa.int32())}),
        "all7": pa.table({"bk": pa.array([7] * 5, pa.int32()), "bk2": pa.array([0] * 5, pa.int64()),
                          "bw": pa.array(["x"] * 5), "bv": pa.array(np.arange(5), pa.int32())}),
        "left7": pa.table({"ak": pa.array([7, 7, 7], pa.int32()), "ak2": pa.array([0, 0, 1], pa.int64()),
                           "aw": pa.array(["x", "y", "x"]), "av": pa.array([1, 2, 3], pa.int32())}),
    }


@pytest.fixture(scope="module")
def check(tables):
    return SqlCheck(tables)


JOINS = [
    "SELECT * FROM a {kind} b ON ak = bk",
    "SELECT * FROM a {kind} b ON ak = bk AND ak2 = bk2",
    "SELECT * FROM a {kind} z ON ak = bk AND av < bv",
    "SELECT * FROM a {kind} e ON ak = bk",
    "SELECT * FROM e {kind} a ON ak = bk",
    "SELECT * FROM a {kind} miss ON ak = bk",
    "SELECT * FROM left7 {kind} all7 ON ak = bk",
]
SEMI = [
    "SELECT * FROM a WHERE ak IN (SELECT bk FROM z)",
    "SELECT * FROM a WHERE ak NOT IN (SELECT bk FROM b WHERE bk IS NOT NULL)",
    "SELECT * FROM a WHERE EXISTS (SELECT * FROM b WHERE bk = ak AND bv > av)",
    "SELECT * FROM a WHERE NOT EXISTS (SELECT * FROM z WHERE bk = ak AND bw = aw)",
    "SELECT * FROM a SEMI JOIN all7 ON ak = bk",
    "SELECT * FROM a ANTI JOIN e ON ak = bk",
]


@pytest.mark.parametrize("algo", ["hash", "merge", "nested_loop", "direct", "radix"])
@pytest.mark.parametrize("kind", ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"])
def test_join_algorithms_match_duckdb(check, algo, kind):
    check.con.join_algorithm = algo
    try:
        for q in JOINS:
            check(q.format(kind=kind))
    finally:
        check.con.join_algorithm = "auto"


@pytest.mark.parametrize("algo", ["hash", "merge", "nested_loop", "direct", "radix"])
def test_semi_anti_algorithms_match_duckdb(check, algo):
    check.con.join_algorithm = algo
    try:
        for q in SEMI:
            check(q)
    finally:
        check.con.join_algorithm = "auto"


def test_algorithm_rule():
    assert choose_algorithm(10, 10, presorted=False) == "nested_loop"
    assert choose_algorithm(1000, 1000, presorted=True) == "merge"
    assert choose_algorithm(1000, 1000, presorted=False) == "hash"
    assert choose_algorithm(10, 10, presorted=False, forced="hash") == "hash"


def _notes(con, q):
    return con.sql("EXPLAIN ANALYZE " + q).to_pandas()


def test_merge_join_chosen_for_sorted_inputs_and_correct():
    rng = np.random.default_rng(3)
    o = pa.table({"ok": pa.array(np.arange(0, 400, 2), pa.int64()), "ov": pa.array(rng.integers(0, 9, 200), pa.int32())})
    li = pa.table({"lk": pa.array(np.sort(rng.integers(0, 420, 500)), pa.int64()),
                   "lv": pa.array(rng.integers(0, 9, 500), pa.int32())})
    check = SqlCheck({"o": o, "li": li, "shuffled": li.take(pa.array(rng.permutation(500)))})
    q = "SELECT * FROM li JOIN o ON lk = ok WHERE lv > 2"
    check(q)
    check("SELECT * FROM li LEFT JOIN o ON lk = ok")
    notes = " ".join(_notes(check.con, q)["notes"])
    assert "merge join (inputs already sorted)" in notes
    notes = " ".join(_notes(check.con, "SELECT * FROM shuffled JOIN o ON lk = ok")["notes"])
    # unsorted: a table join (the planner picks the perfect hash: ok is unique and dense)
    assert ("hash join" in notes or "perfect-hash (direct) join" in notes) and "merge" not in notes


def test_join_pairs_all_algorithms_agree():
    g = torch.Generator().manual_seed(0)
    lk = torch.randint(0, 20, (150,), generator=g)
    rk = torch.randint(0, 20, (90,), generator=g)
    lv = torch.rand(150, generator=g) > 0.1
    rv = torch.rand(90, generator=g) > 0.1
    ref = sorted((i, j) for i in range(150) for j in range(90) if lk[i] == rk[j] and lv[i] and rv[j])
    for algo in ("hash", "merge", "nested_loop"):
        li, ri = join_pairs(lk, rk, lv, rv, algorithm=algo)
        assert sorted(zip(li.tolist(), ri.tolist())) == ref, algo
    for budget in (48 * 8, 48 * 30):  # 16 and 4 partitions
        li, ri = join_pairs(lk, rk, lv, rv, algorithm="hash", budget=budget)
        assert sorted(zip(li.tolist(), ri.tolist())) == ref


# ------------------------------------------------------------------------------------- partitioning
PARTITIONED = [
    "SELECT * FROM a JOIN z ON ak = bk",
    "SELECT * FROM a LEFT JOIN b ON ak = bk AND ak2 = bk2",
    "SELECT * FROM a FULL JOIN z ON ak = bk AND av < bv",
    "SELECT * FROM a WHERE ak IN (SELECT bk FROM z)",
    "SELECT * FROM a WHERE NOT EXISTS (SELECT * FROM b WHERE bk = ak)",
    "SELECT ak, aw, count(*), sum(av), min(aw), max(av), count(DISTINCT ak2), avg(av) FROM a GROUP BY ak, aw",
    "SELECT bk, count(*) FROM z GROUP BY bk",
]


@pytest.mark.parametrize("q", PARTITIONED)
def test_radix_partitioning_under_budget_equals_unpartitioned(tables, check, q):
    small = sql.connect("cpu", memory_budget=256, join_algorithm="hash")
    full = sql.connect("cpu", join_algorithm="hash")
    for name, t in tables.items():
        small.register(name, t)
        full.register(name, t)
    got, want = small.sql(q).to_arrow(), full.sql(q).to_arrow()
    if "GROUP BY" in q:  # groups come out partition by partition
        keys = [(c, "ascending") for c in got.column_names[:2]]
        got, want = got.sort_by(keys), want.sort_by(keys)
    assert got.equals(want), q
    notes = " ".join(small.sql("EXPLAIN ANALYZE " + q).to_pandas()["notes"])
    assert "radix-partitioned into" in notes
    check(q)


def test_partition_helpers():
    assert K.partition_bits(1000, None) == 0
    assert K.partition_bits(1000, 1000) == 0
    assert K.partition_bits(1001, 1000) == 1
    assert K.partition_bits(1 << 20, 1000) == 11
    keys = torch.arange(-5000, 5000)
    p = K.partition_of(keys, 3)
    assert int(p.min()) >= 0 and int(p.max()) <= 7
    sizes = torch.bincount(p, minlength=8)
    assert int(sizes.min()) > 800  # spread, not clustered
    parts = K.partitions(p, 3)
    assert sorted(torch.cat(parts).tolist()) == list(range(10000))
    assert all(bool((x[1:] > x[:-1]).all()) for x in parts if len(x) > 1)  # row order kept


def _tuple_groups(cols: list[Column]) -> list[tuple]:
    """Reference: each row's key tuple, NULL as None."""
    vals = [[None if (c.valid is not None and not bool(c.valid[i])) else int(c.values[i]) for i in range(len(c))]
            for c in cols]
    return list(zip(*vals))


def _same_partition(ids: torch.Tensor, tuples: list[tuple]) -> bool:
    """Rows share an id exactly when they share a key tuple, and ids are dense 0..G-1."""
    first = {}
    for g, t in zip(ids.tolist(), tuples):
        if first.setdefault(t, g) != g:
            return False
    return len(set(first.values())) == len(first) and sorted(set(ids.tolist())) == list(range(len(first)))


@pytest.mark.parametrize("lo,hi", [(0, 5), (-3, 3), (0, 50_000_000), (-(2**62), 2**62)])
def test_dense_ids_every_encoding(lo, hi):
    """Packed direct-address, packed hash and per-column hash encodings all group by the key tuple,
    NULL being one value of its own; a range past 2^62 falls back to grouping column by column."""
    g = torch.Generator().manual_seed(lo & 0xFFFF)
    n = 3000
    a = torch.randint(0, 7, (n,), generator=g) * ((hi - lo) // 7) + lo
    b = torch.randint(-2, 2, (n,), generator=g, dtype=torch.int32)
    cols = [Column(a, torch.rand(n, generator=g) > 0.1, T.INT64), Column(b, torch.rand(n, generator=g) > 0.3, T.INT32)]
    notes = []

    class Ctx:
        def note(self, text):
            notes.append(text)

    ids, count = K.dense_ids(cols, n, "cpu", Ctx())
    tuples = _tuple_groups(cols)
    assert count == len(set(tuples)) and _same_partition(ids, tuples)
    if hi - lo < 2 * n:
        assert "direct-address" in notes[0]
        order = sorted(set(tuples), key=lambda t: tuple((x is None, x) for x in t))  # numbered in key order
        assert [order.index(t) for t in tuples] == ids.tolist()
    elif hi - lo < 2**55:
        assert "packed keys" in notes[0]
    else:
        assert "per key column" in notes[0]


def test_join_keys_pack_two_columns_over_both_sides():
    """Two int key columns become one int64 per side, equal exactly when both columns are, with
    bounds taken over both sides (a value present on one side only still gets its own code)."""
    g = torch.Generator().manual_seed(3)
    la, lb = torch.randint(-5, 40, (500,), generator=g), torch.randint(0, 9, (500,), generator=g, dtype=torch.int32)
    ra, rb = torch.randint(0, 60, (300,), generator=g), torch.randint(-4, 5, (300,), generator=g, dtype=torch.int32)
    lv = torch.rand(500, generator=g) > 0.2
    left = [Column(la, lv, T.INT64), Column(lb, None, T.INT32)]
    right = [Column(ra, None, T.INT64), Column(rb, None, T.INT32)]
    lk, rk, lvalid, rvalid = K.join_keys(left, right, "cpu")
    assert lk.dtype == rk.dtype == torch.int64 and rvalid is None and torch.equal(lvalid, lv)
    want = (la[:, None] == ra[None, :]) & (lb[:, None] == rb[None, :])
    assert torch.equal((lk[:, None] == rk[None, :])[lv], want[lv])  # NULL rows never match: valid says so


def test_connect_options_are_validated():
    with pytest.raises(ValueError, match="memory_budget must be > 0"):
        sql.connect("cpu", memory_budget=0)
    with pytest.raises(TypeError, match="memory_budget must be an int"):
        sql.connect("cpu", memory_budget=1.5)
    with pytest.raises(ValueError, match="join_algorithm must be one of"):
        sql.connect("cpu", join_algorithm="grace")


# ---------------------------------------------------------------------------------------------- top-k
@pytest.fixture(scope="module")
def tcheck():
    rng = np.random.default_rng(17)
    return SqlCheck({"t": random_table(rng, 200, keys=4)})


@pytest.mark.parametrize("order", [
    "k", "k DESC", "k NULLS FIRST", "k DESC NULLS FIRST", "s DESC, b", "f", "d DESC NULLS FIRST, id",
    "flag, dt DESC", "dt, s",
])
@pytest.mark.parametrize("lim", ["LIMIT 5", "LIMIT 7 OFFSET 3", "LIMIT 60", "LIMIT 500"])
def test_topk_matches_sort_then_limit(tcheck, order, lim):
    q = f"SELECT id, k, s, b, f, d, dt, flag FROM t ORDER BY {order} {lim}"
    rel = tcheck.con.sql(q)
    assert "TopK" in rel.explain()
    got = rel.to_arrow()
    # exact rows, ties included, in the order of the stable full sort (the plan without TopK)
    from opforge.sql.executor import Executor
    from opforge.sql import plan as P
    top = rel.plan
    while not isinstance(top, P.TopK):
        top = top.child
    full = P.Limit(P.Sort(top.child, top.keys), top.limit, top.offset)
    proj = rel.plan
    want = Executor(tcheck.con._tables, tcheck.con.device).to_arrow(P.Project(full, proj.exprs))
    assert got.equals(want.rename_columns(got.column_names)), q
    if "id" in order:  # fully determined: DuckDB must agree row for row
        tcheck(q, ordered=True)


def _random_batch(n, g, dtype=torch.int64, null_frac=0.2):
    vals = torch.randint(0, 6, (n,), generator=g).to(dtype)
    valid = torch.rand(n, generator=g) > null_frac
    cols = {0: Column(vals, valid, T.INT64 if not dtype.is_floating_point else T.FLOAT64),
            1: Column(torch.randint(0, 3, (n,), generator=g), None, T.INT64),
            2: Column(torch.arange(n), None, T.INT64)}
    return Batch(cols, n, torch.device("cpu"))


@pytest.mark.parametrize("desc", [False, True])
@pytest.mark.parametrize("nulls_first", [False, True])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_topk_operator_equals_stable_sort_slice(desc, nulls_first, dtype):
    g = torch.Generator().manual_seed(5)
    batch = _random_batch(120, g, dtype)
    if dtype == torch.float64:
        batch.cols[0].values[::17] = float("nan")  # NaN: falls back to the full sort
    keys = [(Ref(0, batch.cols[0].type), desc, nulls_first), (Ref(1, T.INT64), True, False)]
    perm = sort_permutation([(batch.cols[0].values, batch.cols[0].valid, desc, nulls_first),
                             (batch.cols[1].values, None, True, False)], batch.n, batch.device)
    for limit, offset in [(1, 0), (5, 0), (10, 7), (30, 0), (119, 1), (200, 0), (0, 3)]:
        out = run_topk(TopK(None, keys, limit, offset), batch)
        assert out.cols[2].values.tolist() == perm[offset:offset + limit].tolist(), (limit, offset)


def test_topk_candidates_keep_every_tie():
    v = torch.tensor([5, 1, 3, 3, 3, 9, 0])
    idx = candidates(v, None, False, False, 3)  # 0, 1, then the 3s tie for third place
    assert idx.tolist() == [1, 2, 3, 4, 6]
    valid = torch.tensor([True, False, True, True, False, True, True])
    assert candidates(v, valid, False, True, 2).tolist() == [1, 4]  # two NULLs first fill it
    assert candidates(v, valid, True, False, 9) is None


# ------------------------------------------------------------------------------------------ aggregate
def test_aggregate_through_segment_reduce_matches_duckdb():
    rng = np.random.default_rng(8)
    t = random_table(rng, 150, keys=6)
    check = SqlCheck({"t": t, "e": t.slice(0, 0)})
    check("SELECT k, s, count(*), count(i), sum(i), sum(b), sum(d), avg(f), min(s), max(dt), min(f), "
          "max(flag), count(DISTINCT s) FROM t GROUP BY k, s")
    check("SELECT count(*), sum(i), min(s), max(d) FROM e")
    check("SELECT k, sum(i) FROM e GROUP BY k")
    f = pa.table({"g": pa.array([1, 1, 2, 2, 3]), "x": pa.array([1.0, float("nan"), float("nan"), float("nan"), 2.0])})
    check = SqlCheck({"f": f})
    check("SELECT g, min(x), max(x) FROM f GROUP BY g")
