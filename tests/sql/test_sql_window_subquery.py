"""A correlated aggregate subquery over the outer query's own relations becomes a window over the
outer rows (``optimizer._windowed_subqueries``): same answers as DuckDB; EXPLAIN shows the Window
and no second copy of the joins; not applied when the subquery reads rows the outer query does not."""
import duckdb
import numpy as np
import pyarrow as pa
import pytest

import opforge.sql as sql


@pytest.fixture(scope="module")
def engines():
    rng = np.random.default_rng(9)
    n = 3000
    ps = pa.table({"pk": pa.array(rng.integers(0, 200, n), pa.int64()), "sk": pa.array(rng.integers(0, 50, n), pa.int64()),
                   "cost": pa.array(rng.integers(1, 100, n).astype(float))})
    part = pa.table({"p_key": pa.array(np.arange(200), pa.int64()), "size": pa.array(rng.integers(0, 5, 200), pa.int64())})
    supp = pa.table({"s_key": pa.array(np.arange(50), pa.int64()), "region": pa.array(rng.integers(0, 3, 50), pa.int64())})
    con, duck = sql.connect("cpu"), duckdb.connect()
    for name, t in (("ps", ps), ("part", part), ("supp", supp)):
        con.register(name, t)
        duck.register(name, t)
    return con, duck


MIN_COST = ("SELECT p_key, sk, cost FROM part, ps, supp WHERE p_key = pk AND sk = s_key AND size = 3 AND region = 1 "
            "AND cost = (SELECT min(cost) FROM ps, supp WHERE p_key = pk AND sk = s_key AND region = 1) ")
BELOW_AVG = ("SELECT count(*), sum(cost) FROM ps, part WHERE pk = p_key AND size = 2 "
             "AND cost < 0.5 * (SELECT avg(cost) FROM ps WHERE pk = p_key)")


@pytest.mark.parametrize("q", [MIN_COST, BELOW_AVG])
def test_window_rewrite_matches_duckdb(engines, q):
    con, duck = engines
    plan = con.sql(q).explain()
    assert "Window partition=" in plan
    got, want = sorted(con.sql(q).fetchall()), sorted(duck.sql(q).fetchall())
    assert len(got) == len(want) and len(got) > 0
    for a, b in zip(got, want):
        assert list(a) == pytest.approx(list(b), rel=1e-12)


def test_no_window_when_the_subquery_reads_other_rows(engines):
    """The subquery has no region filter: its minimum runs over suppliers the outer query drops."""
    con, duck = engines
    q = MIN_COST.replace("AND region = 1) ", ") ")
    assert "Window" not in con.sql(q).explain()
    assert sorted(con.sql(q).fetchall()) == sorted(duck.sql(q).fetchall())
