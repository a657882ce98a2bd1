"""Issue 25: a cross product is never materialized for aggregates that can be computed from its two
sides, and a materialized join without equi keys respects the memory budget (or the free memory):
sliced when it has a residual condition, refused before allocating when its output cannot fit."""
import decimal
import resource

import numpy as np
import pyarrow as pa
import pytest

import opforge.sql as sql
from sql_reference import SqlCheck

BIG = 200_000  # BIG x BIG = 4e10 pairs: 640 GB of pair indexes alone, if they were materialized


def _big():
    rng = np.random.default_rng(7)
    return pa.table({"x": pa.array(np.arange(BIG), pa.int64()), "y": pa.array(rng.random(BIG))})


def test_count_of_cross_product_is_not_materialized():
    con = sql.connect("cpu")
    con.register("c", _big())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    got = con.sql("SELECT count(*), sum(a.x), max(b.x), min(a.x) FROM c a, c b").fetchall()
    grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    s = BIG * (BIG - 1) // 2
    assert got == [(BIG * BIG, s * BIG, BIG - 1, 0)]
    assert grew_mib < 512, f"peak host memory grew by {grew_mib:.0f} MiB"
    text = con.sql("EXPLAIN ANALYZE SELECT count(*) FROM c a, c b").explain()
    assert "cross product not materialized" in text


def test_count_of_cross_product_with_a_budget():
    con = sql.connect("cpu", memory_budget=1 << 16)
    con.register("c", _big())
    assert con.sql("SELECT count(*) FROM c a, c b WHERE a.x < 10").fetchall() == [(10 * BIG,)]


@pytest.fixture(scope="module")
def check():
    rng = np.random.default_rng(3)
    n = 40
    return SqlCheck({
        "l": pa.table({"a": pa.array(rng.integers(-5, 5, n), pa.int64(), mask=rng.random(n) < 0.2),
                       "s": pa.array([f"w{i % 7}" for i in range(n)]),
                       "f": pa.array(rng.random(n))}),
        "r": pa.table({"b": pa.array(rng.integers(0, 9, 25), pa.int32()),
                       "d": pa.array([decimal.Decimal(int(v)).scaleb(-2) for v in rng.integers(-999, 999, 25)],
                                     pa.decimal128(5, 2))}),
        "e": pa.table({"z": pa.array([], pa.int64())}),
    })


@pytest.mark.parametrize("q", [
    "SELECT count(*) FROM l, r",
    "SELECT count(*), count(a), sum(a), avg(a), min(s), max(s), count(DISTINCT a), sum(b), max(d), sum(d) FROM l, r",
    "SELECT count(*), sum(f), min(b) FROM l, r WHERE a > 0 AND b < 5",
    "SELECT count(*), count(a), sum(a), min(a), max(s), count(DISTINCT a) FROM l, e",
    "SELECT count(*), sum(a + b) FROM l, r",  # reads both sides: materialized (small)
])
def test_aggregates_of_cross_products_match_duckdb(check, q):
    check(q)


def test_materialized_cross_join_respects_the_budget():
    con = sql.connect("cpu", memory_budget=1 << 20)
    con.register("c", pa.table({"x": pa.array(np.arange(2000), pa.int64())}))
    with pytest.raises(sql.MemoryLimitError, match=r"2000 x 2000 rows .* > the memory budget \(1048576 bytes\)"):
        con.sql("SELECT a.x, b.x FROM c a, c b").fetchall()
    unbudgeted = sql.connect("cpu")
    unbudgeted.register("c", _big())
    with pytest.raises(sql.MemoryLimitError, match="half of the free memory"):
        unbudgeted.sql("SELECT a.x, b.x FROM c a, c b").fetchall()


def test_theta_join_runs_in_slices_within_the_budget():
    rng = np.random.default_rng(5)
    t = pa.table({"x": pa.array(rng.integers(0, 1000, 300), pa.int64()), "k": pa.array(np.arange(300), pa.int64())})
    check = SqlCheck({"t": t})
    check.con = sql.connect("cpu", memory_budget=1 << 15)
    check.con.register("t", t)
    q = "SELECT a.k, b.k FROM t a, t b WHERE a.x < b.x - 990"
    check(q)
    check("SELECT a.k, b.k FROM t a LEFT JOIN t b ON a.x < b.x - 995")
    assert "in slices of" in check.con.sql(q).explain(analyze=True)
