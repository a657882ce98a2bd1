"""An unaliased select item is named as DuckDB names it (its expression printer: operators in
parentheses, function names lower-case, keywords quoted, casts, CASE), so the names a DuckDB user
reads, or a view exposes, are the same (TPC-DS q02, q41, q61, q79, q85 differed only there)."""
import duckdb
import pyarrow as pa

import opforge.sql as sql

ROW_ITEMS = ["a + b", "(a)", "a / b * 100", "round(a / b, 2)", "substring(s, 1, 3)", "CAST(a AS DECIMAL(15, 4))",
             "CAST(a AS VARCHAR)", "CASE WHEN a > 1 THEN 1 ELSE 0 END", "CASE a WHEN 1 THEN 2 END",
             "a = b AND a < b OR NOT a > 1", "-a", "a * -1", "a BETWEEN 1 AND 2", "a IN (1, 2)", "s LIKE 'x%'",
             "a IS NULL", "a IS NOT NULL", "coalesce(a, b)", "upper(s)", "sum(a) OVER (PARTITION BY b)", "t.a % 2"]
AGGREGATES = ["sum(a) * 1.0 / sum(b)", "count(DISTINCT a)", "stddev_samp(a)", "count(*)"]


def test_unaliased_items_are_named_as_duckdb_names_them():
    t = pa.table({"a": pa.array([1, 2, 3], pa.int32()), "b": pa.array([2, 2, 4], pa.int32()),
                  "s": ["xa", "b", "xc"]})
    con, duck = sql.connect("cpu"), duckdb.connect()
    con.register("t", t)
    duck.register("t", t)
    for items in (ROW_ITEMS, AGGREGATES):
        q = f"SELECT {', '.join(items)} FROM t"
        assert con.sql(q).to_arrow().column_names == duck.sql(q).columns
