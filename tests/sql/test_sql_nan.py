"""Issue 25: NaN in comparisons follows DuckDB's total order (NaN equals itself and is greater than
every other value, +inf included), as joins, GROUP BY, ORDER BY and min / max already do;
'NaN' / 'inf' parse as DOUBLE literals."""
import math

import pyarrow as pa
import pytest

from sql_reference import SqlCheck

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def check():
    return SqlCheck({"t": pa.table({
        "id": pa.array(range(7), pa.int64()),
        "f": pa.array([NAN, 1.0, -1.0, INF, -INF, 0.0, None], pa.float64()),
        "g": pa.array([NAN, NAN, 2.0, INF, NAN, -0.0, 1.0], pa.float64()),
        "h": pa.array([NAN, 1.5, None, -2.5, INF, 0.0, NAN], pa.float32()),
    })})


@pytest.mark.parametrize("cond", [
    "f = f", "f <> f", "f > 0", "f >= 0", "f < 0", "f <= 0", "f = g", "f <> g", "f < g", "f <= g", "f > g",
    "f >= g", "g > 1e308", "g = 'NaN'::DOUBLE", "g > 'inf'::DOUBLE", "NOT (f < g)", "f IN (g, 1.0)",
    "h = h", "h > 0", "h < f", "h = g",
])
def test_nan_comparisons_match_duckdb(check, cond):
    check(f"SELECT id FROM t WHERE {cond}")
    check(f"SELECT id, {cond} AS c FROM t")


def test_nan_literals_parse(check):
    out = check("SELECT 'NaN'::DOUBLE AS a, 'inf'::DOUBLE AS b, '-Infinity'::DOUBLE AS c, 'nan'::DOUBLE AS d")
    a, b, c, d = (out.column(i)[0].as_py() for i in range(4))
    assert math.isnan(a) and b == INF and c == -INF and math.isnan(d)
