"""GROUP BY / aggregates / HAVING / DISTINCT against DuckDB: NULL keys form one group, NULL inputs are
ignored, empty inputs, DuckDB's result types (sum of decimals stays decimal, avg is DOUBLE)."""
import numpy as np
import pyarrow as pa
import pytest

from sql_reference import SqlCheck, random_table


@pytest.fixture(scope="module")
def check():
    rng = np.random.default_rng(3)
    return SqlCheck({"t": random_table(rng, 400), "e": random_table(rng, 0)})


AGGS = "count(*), count(i), count(DISTINCT s), sum(i), sum(b), sum(d), sum(f), avg(i), avg(d), avg(f), " \
       "min(i), max(i), min(s), max(s), min(dt), max(dt), min(d), max(f)"


@pytest.mark.parametrize("keys", ["k", "s", "k, s", "dt", "d", "flag", "k, flag, s", "extract(year from dt)", "i % 3"])
def test_group_by_matches_duckdb(check, keys):
    check(f"SELECT {keys}, {AGGS} FROM t GROUP BY {keys}")


def test_global_aggregates(check):
    check(f"SELECT {AGGS} FROM t")
    check(f"SELECT {AGGS} FROM t WHERE i > 1000")  # no rows: one output row, count 0, others NULL


def test_empty_input_grouped(check):
    check(f"SELECT k, {AGGS} FROM e GROUP BY k")
    check(f"SELECT {AGGS} FROM e")


def test_expressions_over_aggregates_and_having(check):
    check("SELECT k, sum(d) * 2 AS x, sum(i) / count(*) AS y, max(i) - min(i) AS r FROM t GROUP BY k HAVING count(*) > 70")
    check("SELECT s, count(*) AS c FROM t GROUP BY s HAVING sum(i) > 0 AND min(dt) < date '1997-01-01'")
    check("SELECT k + 1 AS kk, count(*) FROM t GROUP BY k + 1")
    check("SELECT k, count(*) AS cnt, sum(d) AS sd FROM t GROUP BY k HAVING cnt > 75 OR sd < 0")
    check("SELECT k AS key, avg(f) FROM t GROUP BY key")
    check("SELECT k, count(*) FROM t GROUP BY 1")
    check("SELECT sum(CASE WHEN s LIKE 'a%' THEN d ELSE 0 END) AS x, sum(d * (1 - 0.5)) AS y FROM t")


def test_distinct(check):
    check("SELECT DISTINCT k, s FROM t")
    check("SELECT DISTINCT flag FROM t")
    check("SELECT count(DISTINCT k), count(DISTINCT dt) FROM t")


def test_sum_of_int_is_hugeint_like(check):
    out = check("SELECT sum(i) AS s, count(*) AS c FROM t")
    assert pa.types.is_decimal(out.schema.field("s").type) and out.schema.field("c").type == pa.int64()


def test_ungrouped_column_is_an_error(check):
    import opforge.sql as sql
    with pytest.raises(sql.SqlError, match="GROUP BY"):
        check.con.sql("SELECT k, i, count(*) FROM t GROUP BY k")
