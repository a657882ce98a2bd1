"""ORDER BY (multi-key, ASC/DESC, NULLS FIRST/LAST with DuckDB's defaults), LIMIT/OFFSET, UNION [ALL]."""
import numpy as np
import pytest

from sql_reference import SqlCheck, random_table


@pytest.fixture(scope="module")
def check():
    rng = np.random.default_rng(9)
    return SqlCheck({"t": random_table(rng, 300), "u": random_table(rng, 40)})


@pytest.mark.parametrize("order", [
    "k, i, b", "k DESC, i, b", "s, b", "s DESC, b DESC", "dt NULLS FIRST, b", "d DESC NULLS FIRST, b",
    "f, b", "flag, k DESC NULLS LAST, b", "i + k, b", "2, 1", "x, b",
])
def test_order_by_matches_duckdb(check, order):
    check(f"SELECT k, i, s, b, dt, d, f, flag, i * 2 AS x, id FROM t ORDER BY {order}, id", ordered=True)


def test_order_by_limit_offset(check):
    check("SELECT k, b FROM t ORDER BY b DESC, id LIMIT 7", ordered=True)
    check("SELECT k, b FROM t ORDER BY b, id LIMIT 5 OFFSET 10", ordered=True)
    check("SELECT k, b FROM t ORDER BY b LIMIT 0", ordered=True)
    check("SELECT k, b FROM t ORDER BY b, id LIMIT 1000", ordered=True)


def test_order_by_aggregate(check):
    check("SELECT k, sum(i) AS s FROM t GROUP BY k ORDER BY s DESC, k", ordered=True)
    check("SELECT k, count(*) FROM t GROUP BY k ORDER BY count(*) DESC, k NULLS FIRST", ordered=True)
    check("SELECT DISTINCT s FROM t ORDER BY s DESC", ordered=True)


def test_union(check):
    check("SELECT k, s FROM t UNION ALL SELECT k, s FROM u")
    check("SELECT k, s FROM t UNION SELECT k, s FROM u")
    check("SELECT i FROM t UNION ALL SELECT b FROM u")  # int32 with int64 widens
    check("SELECT s FROM t UNION SELECT s FROM u ORDER BY 1 LIMIT 5", ordered=True)
