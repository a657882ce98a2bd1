"""Eager aggregation (``optimizer._eager_aggregate``): aggregates computed partly below joins whose
other side has a unique key, against DuckDB on the same tables; EXPLAIN shows the partial
aggregate where it applies and none where the rewrite would be wrong (a key that repeats)."""
import duckdb
import numpy as np
import pyarrow as pa
import pytest

import opforge.sql as sql


@pytest.fixture(scope="module")
def engines():
    rng = np.random.default_rng(5)
    n = 4000
    v = rng.integers(-50, 50, n).astype(float)
    v[rng.random(n) < 0.1] = np.nan  # NULLs in the summed column
    fact = pa.table({"fk": pa.array(rng.integers(0, 300, n), pa.int64()),
                     "v": pa.array(v, pa.float64(), from_pandas=True),
                     "w": pa.array(rng.integers(0, 9, n), pa.int32())})
    dim = pa.table({"dk": pa.array(np.arange(400), pa.int64()),  # keys 300..399 have no fact rows
                    "g": pa.array([f"g{i % 7}" for i in range(400)])})
    dup = pa.table({"xk": pa.array(np.arange(400) % 200, pa.int64()), "h": pa.array(np.arange(400) % 3, pa.int64())})
    con, duck = sql.connect("cpu"), duckdb.connect()
    for name, t in (("fact", fact), ("dim", dim), ("dup", dup)):
        con.register(name, t)
        duck.register(name, t)
    return con, duck


QUERIES = [
    "SELECT g, count(*), sum(v), min(w), max(w), count(v) FROM fact JOIN dim ON fk = dk GROUP BY g",
    "SELECT dk, count(fk) AS c, sum(v) AS s, max(w) AS m FROM dim LEFT JOIN fact ON dk = fk GROUP BY dk",
    "SELECT c, count(*) FROM (SELECT dk, count(fk) AS c FROM dim LEFT JOIN fact ON dk = fk AND w > 3 GROUP BY dk) "
    "GROUP BY c",
    "SELECT g, sum(w) FROM fact JOIN dim ON fk = dk WHERE v > 0 GROUP BY g",
]


@pytest.mark.parametrize("q", QUERIES)
def test_partial_aggregates_below_the_join_match_duckdb(engines, q):
    con, duck = engines
    assert "partial_" in con.sql(q).explain()
    got = sorted(con.sql(q).fetchall(), key=str)
    want = sorted(duck.sql(q).fetchall(), key=str)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            assert x == y or (isinstance(y, float) and abs(x - y) <= 1e-9 * max(1.0, abs(y))), (a, b)


def test_no_partial_aggregate_over_a_repeating_key(engines):
    """dup's xk repeats: each fact row meets two dup rows, so folding fact first would be wrong."""
    con, duck = engines
    q = "SELECT h, sum(w), count(*) FROM fact JOIN dup ON fk = xk GROUP BY h"
    assert "partial_" not in con.sql(q).explain()
    assert sorted(con.sql(q).fetchall()) == sorted(duck.sql(q).fetchall())
