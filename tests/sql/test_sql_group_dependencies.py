"""GROUP BY on the keys that determine the others (``planner/dependencies.py``): a table's unique
key determines its row's columns, and through an inner join's key pair the joined table's columns;
EXPLAIN names the kept keys, the answers equal DuckDB's, and nothing is dropped without a proof."""
import duckdb
import numpy as np
import pyarrow as pa
import pytest

import opforge.sql as sql


@pytest.fixture(scope="module")
def engines():
    rng = np.random.default_rng(4)
    n = 2000
    cust = pa.table({"ck": pa.array(np.arange(300), pa.int64()), "cname": pa.array([f"c{i}" for i in range(300)]),
                     "nk": pa.array(rng.integers(0, 10, 300), pa.int64()),
                     "seg": pa.array([f"s{i % 4}" for i in range(300)])})
    nation = pa.table({"nk2": pa.array(np.arange(10), pa.int64()), "nname": pa.array([f"n{i}" for i in range(10)])})
    orders = pa.table({"ok": pa.array(np.arange(n), pa.int64()), "ock": pa.array(rng.integers(0, 300, n), pa.int64()),
                       "price": pa.array(rng.random(n) * 100)})
    con, duck = sql.connect("cpu"), duckdb.connect()
    for name, t in (("cust", cust), ("nation", nation), ("orders", orders)):
        con.register(name, t)
        duck.register(name, t)
    return con, duck


def _same(con, duck, q):
    got, want = sorted(con.sql(q).fetchall()), sorted(duck.sql(q).fetchall())
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            assert x == (pytest.approx(y, rel=1e-12) if isinstance(y, float) else y)


def test_keys_of_one_row_group_on_the_unique_key(engines):
    con, duck = engines
    q = ("SELECT ck, cname, seg, nname, count(*), sum(price) FROM orders, cust, nation "
         "WHERE ock = ck AND nk = nk2 GROUP BY ck, cname, seg, nname")
    assert "grouped on [ck#" in con.sql(q).explain()
    _same(con, duck, q)


def test_no_dependency_without_a_unique_key(engines):
    """seg repeats over customers and nname over nations: both stay grouping keys."""
    con, duck = engines
    q = "SELECT seg, nname, count(*) FROM cust, nation WHERE nk = nk2 GROUP BY seg, nname"
    assert "grouped on" not in con.sql(q).explain()
    _same(con, duck, q)
