"""Plan rewrites seen through explain(): pushdown, pruning, constant folding, join order; results still
equal DuckDB's."""
import numpy as np
import pyarrow as pa
import pytest

from sql_reference import SqlCheck


@pytest.fixture(scope="module")
def check():
    rng = np.random.default_rng(1)
    n = 80
    return SqlCheck({
        "f": pa.table({"fk": pa.array(rng.integers(0, 10, n), pa.int64()), "fv": pa.array(rng.integers(0, 9, n), pa.int32()),
                       "fpad": pa.array([f"p{i}" for i in range(n)])}),
        "d": pa.table({"dk": pa.array(np.arange(10), pa.int64()), "dname": pa.array([f"d{i % 4}" for i in range(10)])}),
        "g": pa.table({"gk": pa.array(np.arange(4), pa.int64()), "gname": pa.array(["d0", "d1", "d2", "d3"])}),
    })


def _lines(check, q):
    return check.con.sql(q).explain().splitlines()


def test_filter_pushed_into_scans_and_columns_pruned(check):
    q = "SELECT fv, dname FROM f, d WHERE fk = dk AND fv > 3 AND dname = 'd1'"
    lines = _lines(check, q)
    scan_f = next(x for x in lines if "Scan f " in x)
    scan_d = next(x for x in lines if "Scan d " in x)
    assert "filter=" in scan_f and "fpad" not in scan_f
    assert "filter=" in scan_d
    assert not any(x.strip().startswith("Filter") for x in lines)
    check(q)


def test_filter_through_derived_table_and_group_keys(check):
    q = "SELECT * FROM (SELECT fk, sum(fv) AS s FROM f GROUP BY fk) x WHERE fk < 5 AND s > 3"
    lines = _lines(check, q)
    assert "filter=" in next(x for x in lines if "Scan f " in x)  # fk < 5 went below the aggregate
    check(q)


def test_constant_folding(check):
    q = "SELECT fv FROM f WHERE fv < 2 + 3 * 2"
    scan = next(x for x in _lines(check, q) if "Scan f" in x)
    assert "(fv#" in scan and "< 8)" in scan and "+" not in scan and "*" not in scan
    check(q)


def test_join_order_avoids_cross_product(check):
    q = "SELECT fv, gname FROM f, g, d WHERE fk = dk AND dname = gname"
    text = check.con.sql(q).explain()
    assert "cross" not in text
    check(q)


def test_outer_join_filter_stays_above(check):
    q = "SELECT * FROM d LEFT JOIN f ON dk = fk AND fv > 7 WHERE fv IS NULL"
    lines = _lines(check, q)
    assert lines[1].strip().startswith("Filter") or lines[0].strip().startswith("Filter")
    check(q)


@pytest.mark.parametrize("q, into_scans", [
    # TPC-DS q75's shape: a year filter over a CTE's UNION reaches each input's scan
    ("WITH u AS (SELECT fk AS k, fv AS v, 'f' AS src FROM f UNION ALL SELECT dk AS k, 1 AS v, 'd' AS src FROM d) "
     "SELECT k, sum(v) AS s FROM u WHERE k < 4 GROUP BY k", 2),
    # UNION (distinct): the same rows are kept
    ("SELECT * FROM (SELECT fk AS k, fv AS v FROM f UNION SELECT dk, 3 FROM d) u WHERE k >= 7 AND v < 5", 2),
    # a filter on the constant that names each input (q04's sale_type), and one on a key of each
    ("SELECT k, n FROM (SELECT 'f' AS src, fk AS k, count(*) AS n FROM f GROUP BY fk UNION ALL "
     "SELECT 'd' AS src, dk AS k, count(*) AS n FROM d GROUP BY dk) u WHERE src = 'd' AND k > 2", 2),
    # INT32 and INT64 inputs: the union's column is BIGINT; the predicate stays above it
    ("SELECT * FROM (SELECT fv AS x FROM f UNION ALL SELECT dk AS x FROM d) u WHERE x = 3", 0),
])
def test_filter_over_a_union_filters_each_input(check, q, into_scans):
    lines = _lines(check, q)
    assert sum("Scan " in x and "filter=" in x for x in lines) == into_scans, "\n".join(lines)
    check(q)
