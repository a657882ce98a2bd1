"""Window functions and the clauses around them (issue 24), each answer checked against DuckDB:
ranking, offset and framed aggregate functions over ROWS / RANGE / GROUPS frames, PARTITION BY /
ORDER BY with ASC / DESC and NULLS FIRST / LAST, IGNORE NULLS, several windows in one SELECT, windows over
aggregates, QUALIFY, the WINDOW clause, GROUP BY ALL / ORDER BY ALL, VALUES in FROM and
INTERSECT / EXCEPT [ALL]. The table has NULLs in keys and values, ties, and one-row partitions;
what is still refused raises an error that names the construct."""
import duckdb
import numpy as np
import pyarrow as pa
import pytest

import opforge.sql as sql
from opforge.sql.errors import NotSupportedError
from sql_reference import SqlCheck


def _tables():
    rng = np.random.default_rng(24)
    n = 40
    g = rng.integers(0, 4, n).astype(np.int32)
    g[-1] = 9  # a partition of one row
    return {
        "w": pa.table({
            "id": pa.array(np.arange(n), pa.int64()),
            "g": pa.array(g, mask=rng.random(n) < 0.1),
            "x": pa.array(rng.integers(0, 6, n), pa.int64(), mask=rng.random(n) < 0.2),  # ties
            "f": pa.array(np.round(rng.normal(0, 3, n), 2), mask=rng.random(n) < 0.15),
            "d": pa.array([f"{v:.2f}" for v in rng.uniform(0, 50, n)], pa.string()).cast(pa.decimal128(6, 2)),
            "s": pa.array(rng.choice(["ant", "bee", "cat", "dog", ""], n), mask=rng.random(n) < 0.1),
        }),
        "e": pa.table({"g": pa.array([], pa.int32()), "x": pa.array([], pa.int64())}),
    }


@pytest.fixture(scope="module")
def check():
    return SqlCheck(_tables())


@pytest.mark.parametrize("q", [
    # ranking, with ties, NULL keys and one-row partitions
    "SELECT id, row_number() OVER (PARTITION BY g ORDER BY x, id), rank() OVER (PARTITION BY g ORDER BY x), "
    "dense_rank() OVER (PARTITION BY g ORDER BY x DESC NULLS FIRST) FROM w",
    "SELECT id, percent_rank() OVER (PARTITION BY g ORDER BY x NULLS FIRST), cume_dist() OVER (PARTITION BY g ORDER BY x), "
    "ntile(3) OVER (ORDER BY id), ntile(7) OVER (PARTITION BY g ORDER BY id DESC) FROM w",
    # offset functions
    "SELECT id, lag(x) OVER (PARTITION BY g ORDER BY id), lead(x, 2, -1) OVER (PARTITION BY g ORDER BY id), "
    "lag(s, 1, 'none') OVER (ORDER BY id DESC), lead(f, 0) OVER (ORDER BY id) FROM w",
    "SELECT id, first_value(x) OVER (PARTITION BY g ORDER BY f NULLS FIRST, id), last_value(s) OVER (PARTITION BY g ORDER BY x, id), "
    "nth_value(f, 2) OVER (PARTITION BY g ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) FROM w",
    "SELECT id, first_value(x IGNORE NULLS) OVER (PARTITION BY g ORDER BY id), "
    "last_value(s IGNORE NULLS) OVER (ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), "
    "nth_value(f, 2 IGNORE NULLS) OVER (ORDER BY id ROWS BETWEEN 2 PRECEDING AND 3 FOLLOWING), "
    "lag(x, 2 IGNORE NULLS) OVER (PARTITION BY g ORDER BY id), lead(s, 1, 'none' IGNORE NULLS) OVER (ORDER BY id) FROM w",
    # aggregates over frames: default frames, ROWS, RANGE (offsets, DESC, NULL keys), GROUPS
    "SELECT id, sum(x) OVER (PARTITION BY g), avg(f) OVER (PARTITION BY g ORDER BY x), count(x) OVER (ORDER BY x), "
    "count(*) OVER (PARTITION BY g ORDER BY id ROWS 2 PRECEDING), min(s) OVER (), max(d) OVER (PARTITION BY g) FROM w",
    "SELECT id, sum(d) OVER (ORDER BY id ROWS BETWEEN 1 PRECEDING AND 2 FOLLOWING), "
    "min(f) OVER (PARTITION BY g ORDER BY id ROWS BETWEEN 3 FOLLOWING AND 5 FOLLOWING), "
    "max(x) OVER (ORDER BY id ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) FROM w",
    "SELECT id, sum(x) OVER (PARTITION BY g ORDER BY f RANGE BETWEEN 1.5 PRECEDING AND 2 FOLLOWING), "
    "count(f) OVER (ORDER BY x DESC NULLS FIRST RANGE BETWEEN 1 PRECEDING AND CURRENT ROW), "
    "max(f) OVER (ORDER BY d RANGE BETWEEN CURRENT ROW AND 10 FOLLOWING) FROM w",
    "SELECT id, sum(f) OVER (PARTITION BY g ORDER BY x GROUPS BETWEEN 1 PRECEDING AND 1 FOLLOWING), "
    "min(x) OVER (ORDER BY x DESC GROUPS 2 PRECEDING), count(*) OVER (ORDER BY x GROUPS BETWEEN CURRENT ROW AND 1 FOLLOWING) FROM w",
    "SELECT id, avg(x) FILTER (WHERE x > 1) OVER (PARTITION BY g), "
    "count(*) FILTER (WHERE s <> 'ant') OVER (ORDER BY id ROWS 3 PRECEDING) FROM w",
    "SELECT id, sum(x) OVER (ORDER BY id ROWS BETWEEN id % 4 PRECEDING AND (id * 7) % 3 FOLLOWING), "
    "max(id) OVER (ORDER BY f RANGE BETWEEN CURRENT ROW AND abs(f) FOLLOWING) FROM w",
    "SELECT id, t FROM (SELECT id, sum(f) OVER (ORDER BY id ROWS coalesce(g, 0) PRECEDING) AS t FROM w)",
    "SELECT id, count(DISTINCT s) OVER (PARTITION BY g ORDER BY id), bool_and(x > 1) OVER (PARTITION BY g), "
    "count(DISTINCT f) OVER (ORDER BY x, id ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING), "
    "bool_or(s = 'cat') OVER (ORDER BY id ROWS 2 PRECEDING) FROM w",
    "SELECT id, count(DISTINCT x) OVER (PARTITION BY g), sum(x) OVER (ORDER BY id ROWS BETWEEN 2 FOLLOWING AND 1 FOLLOWING) FROM w",
    # windows over aggregates, several windows, QUALIFY, the WINDOW clause
    "SELECT g, sum(x), rank() OVER (ORDER BY sum(x) DESC NULLS LAST), sum(sum(x)) OVER (ORDER BY g) FROM w GROUP BY g",
    "SELECT id, g, row_number() OVER win, sum(x) OVER (win ROWS 1 PRECEDING) FROM w WINDOW win AS (PARTITION BY g ORDER BY id)",
    "SELECT g, id, x, row_number() OVER (PARTITION BY g ORDER BY x DESC, id) AS rn FROM w QUALIFY rn <= 2",
    "SELECT g, id FROM w QUALIFY sum(x) OVER (PARTITION BY g) > 10 AND rank() OVER (PARTITION BY g ORDER BY id) = 1",
    "SELECT DISTINCT g, count(*) OVER (PARTITION BY g) FROM w",
    # windows over no rows
    "SELECT g, row_number() OVER (ORDER BY x), sum(x) OVER (PARTITION BY g) FROM e",
    "SELECT id, rank() OVER (ORDER BY x) FROM w WHERE id < 0",
    # GROUP BY ALL / ORDER BY ALL, VALUES, INTERSECT / EXCEPT [ALL]
    "SELECT g, s, count(*), sum(x) FROM w GROUP BY ALL",
    "SELECT g, s, count(*), sum(x) FROM w GROUP BY ROLLUP (g, s)",
    "SELECT g, s, max(f) FROM w GROUP BY CUBE (g, s) HAVING count(*) > 1",
    "SELECT g % 2 AS p, s, min(id) FROM w GROUP BY GROUPING SETS ((p), (p, s), ())",
    "SELECT g + 1, s, sum(x) * 2, grouping(g + 1, s) FROM w GROUP BY GROUPING SETS ((g + 1), (s), ())",
    "SELECT g, (SELECT max(x) FROM w w2 WHERE w2.g = w.g) AS m, sum(x) FROM w GROUP BY ROLLUP (g)",
    "SELECT * FROM (VALUES (1, 'a'), (2, NULL), (NULL, 'c'), (2, 'b')) v(k, t) JOIN w ON w.g = v.k",
    "SELECT g, x FROM w INTERSECT SELECT g, x FROM w WHERE id % 3 = 0",
    "SELECT g FROM w INTERSECT ALL SELECT g FROM w WHERE id % 2 = 0",
    "SELECT g, s FROM w EXCEPT SELECT g, s FROM w WHERE x > 2",
    "SELECT g FROM w EXCEPT ALL SELECT g FROM w WHERE id % 3 = 0",
    "SELECT g FROM w UNION SELECT s FROM w",
    "SELECT NULL UNION ALL SELECT 'x' UNION ALL SELECT 1.5",
])
def test_matches_duckdb(check, q):
    check(q)


@pytest.mark.parametrize("q", [
    "SELECT g, x, id FROM w ORDER BY ALL",
    "SELECT g, count(*) AS c FROM w GROUP BY ALL ORDER BY ALL DESC",
    "SELECT id, row_number() OVER (ORDER BY f DESC NULLS LAST, id) AS r FROM w ORDER BY r LIMIT 5",
    "SELECT x FROM (VALUES (3), (1), (2)) t(x) UNION ALL SELECT 0 ORDER BY 1",
    "SELECT g % 2 AS m, id, rank() OVER (ORDER BY m DESC, id) FROM w ORDER BY id",
    "SELECT g, s, sum(x) AS t FROM w GROUP BY ROLLUP (g, s) ORDER BY t DESC NULLS LAST, g, s LIMIT 6",
    "SELECT g AS s, s AS g, sum(x) FROM w GROUP BY ROLLUP (w.g, w.s) ORDER BY s NULLS FIRST, g NULLS FIRST, 3",
    # GROUPING() and windows over the union of the grouping sets (TPC-DS q36 / q70 / q86)
    "SELECT sum(x) AS t, g, s, grouping(g) + grouping(s) AS h, rank() OVER (PARTITION BY grouping(g) + grouping(s), "
    "CASE WHEN grouping(s) = 0 THEN g END ORDER BY sum(x) DESC NULLS LAST) AS r FROM w GROUP BY ROLLUP (g, s) "
    "ORDER BY h DESC, CASE WHEN grouping(g) + grouping(s) = 0 THEN g END NULLS FIRST, r, s NULLS FIRST",
    "SELECT g, s, grouping(g, s), count(*), sum(count(*)) OVER (PARTITION BY grouping(g, s)) AS share "
    "FROM w GROUP BY CUBE (g, s) HAVING count(*) > 1 ORDER BY 3, 1 NULLS FIRST, 2 NULLS FIRST",
    "SELECT g % 2 AS p, grouping(p), max(id) FROM w GROUP BY GROUPING SETS ((p), ()) "
    "QUALIFY row_number() OVER (ORDER BY max(id) DESC, grouping(p)) <= 2 ORDER BY 3 DESC, 2",
    "SELECT g AS a FROM w UNION SELECT x AS b FROM w ORDER BY b DESC",
])
def test_ordered_results_match_duckdb(check, q):
    check(q, ordered=True)


@pytest.mark.triton_kernels
def test_prefix_sums_run_the_triton_scan(check):
    """The frames' prefix sums through dispatch's own choice (the Triton scan under the interpreter)."""
    check("SELECT id, sum(x) OVER (PARTITION BY g ORDER BY id ROWS 1 PRECEDING), rank() OVER (ORDER BY x) FROM w")


@pytest.mark.parametrize("q, construct", [
    ("SELECT sum(x) OVER (ORDER BY id ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING EXCLUDE CURRENT ROW) FROM w", "EXCLUDE"),
    ("SELECT count(DISTINCT x) OVER (ORDER BY id ROWS BETWEEN 2 PRECEDING AND 2 FOLLOWING) FROM w", "DISTINCT"),
    ("SELECT cume_dist(ORDER BY x) OVER (ORDER BY id) FROM w", "arguments"),
    ("SELECT string_agg(s, ',') OVER () FROM w", "window function"),
    ("SELECT sum(x) OVER (ORDER BY x ROWS 1 PRECEDING) FROM (VALUES (4611686018427387904), (4611686018427387904)) v(x)",
     "int64"),
])
def test_refused_constructs_are_named(check, q, construct):
    check.reference(q)  # DuckDB answers: opforge must refuse, never answer wrongly
    with pytest.raises(NotSupportedError, match=construct):
        check.con.sql(q).to_arrow()


@pytest.mark.parametrize("q", [
    "SELECT id FROM w WHERE row_number() OVER () > 1",
    "SELECT sum(row_number() OVER ()) OVER () FROM w",
    "SELECT g FROM w GROUP BY g HAVING rank() OVER (ORDER BY g) > 1",
    "SELECT sum(rank() OVER ()) FROM w",
    "SELECT g FROM w GROUP BY rank() OVER ()",
    "SELECT rank() OVER missing FROM w",
    "SELECT sum(x) OVER (ORDER BY s RANGE BETWEEN 1 PRECEDING AND CURRENT ROW) FROM w",
    "SELECT ntile(0) OVER (ORDER BY id) FROM w",
    "SELECT nth_value(x, 2, 3) OVER (ORDER BY id) FROM w",
    "SELECT id FROM w QUALIFY id > 1",
    "SELECT sum(x IGNORE NULLS) OVER (ORDER BY id) FROM w",
    "SELECT sum(x) OVER (ORDER BY id ROWS BETWEEN CURRENT ROW AND 1 PRECEDING) FROM w",
    "SELECT sum(x) OVER (ORDER BY id ROWS BETWEEN x PRECEDING AND CURRENT ROW) FROM w",
    "SELECT g FROM w INTERSECT SELECT g, x FROM w",
    "SELECT * FROM (VALUES (1, 2), (3)) v",
    "SELECT * FROM (VALUES (1), ('two'), (NULL)) v(a)",
])
def test_errors_where_duckdb_errs(check, q):
    with pytest.raises(duckdb.Error):
        check.reference(q)
    with pytest.raises(sql.SqlError):
        check.con.sql(q).to_arrow()


def test_partition_key_filter_runs_below_the_window(check):
    """A predicate over the partition keys keeps or drops whole partitions: it filters the scan;
    one over a window's result stays above the window."""
    q = "SELECT * FROM (SELECT g, id, rank() OVER (PARTITION BY g ORDER BY x) AS r FROM w) WHERE g = 1 AND r <= 2"
    check(q)
    plan = check.con.sql(q).explain()
    assert "filter=[(g#" in plan and plan.index("WindowFunctions") < plan.index("Scan w")
    assert "r#" not in plan.split("WindowFunctions")[1]  # r <= 2 is above the window
