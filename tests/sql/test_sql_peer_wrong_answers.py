"""Wrong answers DuckDB's sqllogictest files exposed (issue 24): each case is checked against DuckDB,
and where DuckDB raises an error opforge must raise one too instead of returning a result."""
import duckdb
import pyarrow as pa
import pytest

import opforge.sql as sql
from sql_reference import SqlCheck

TABLES = {
    "integers": pa.table({"i": pa.array([1, 4], pa.int32()), "j": pa.array([2, 5], pa.int32()),
                          "k": pa.array([3, None], pa.int32())}),
    "words": pa.table({"s": pa.array(["  both  ", "xxaxx", None, "", "yxy"]),
                       "n": pa.array([1, None, 3, 4, 5], pa.int64())}),
    "ten": pa.table({"x": pa.array(list(range(10)), pa.int64())}),
}


@pytest.fixture(scope="module")
def check():
    return SqlCheck(TABLES)


def assert_both_fail(check, query):
    with pytest.raises(duckdb.Error):
        check.reference(query)
    with pytest.raises(sql.SqlError):
        check.con.sql(query).to_arrow()


@pytest.mark.parametrize("q", [
    "SELECT * EXCLUDE i FROM integers",
    "SELECT * EXCLUDE (i, k) FROM integers",
    "SELECT * EXCLUDE (\"J\") FROM integers",
    "SELECT integers.* EXCLUDE ('i') FROM integers",
    "SELECT * EXCLUDE (integers.i, integers.j) FROM integers",
    "SELECT * EXCEPT (j) FROM integers",
    "SELECT i1.* EXCLUDE (i, j), i2.* EXCLUDE (i, j, k) FROM integers i1, integers i2",
    "SELECT * EXCLUDE (i1.i) FROM integers i1, integers i2",
    "SELECT * REPLACE (i + 100 AS i) FROM integers",
    "SELECT * EXCLUDE (k) REPLACE (i * 2 AS i, j + 1 AS \"J\") FROM integers",
    "SELECT integers.* EXCLUDE (k) RENAME (j AS jj) FROM integers",
])
def test_star_modifiers(check, q):
    check(q)


@pytest.mark.parametrize("q", [
    "SELECT * EXCLUDE (i, j, k) FROM integers",
    "SELECT * EXCLUDE (blabla) FROM integers",
    "SELECT integers.* EXCLUDE (blabla) FROM integers",
    "SELECT * EXCLUDE (integers2.i) FROM integers",
    "SELECT * EXCLUDE (i, i) FROM integers",
    "SELECT * EXCLUDE (integers.i, i) FROM integers",
    "SELECT * REPLACE (i + 100 AS blabla) FROM integers",
    "SELECT * REPLACE (i + 1 AS i, i + 2 AS i) FROM integers",
    "SELECT * EXCLUDE (i) REPLACE (i + 100 AS i) FROM integers",
])
def test_star_modifier_errors(check, q):
    assert_both_fail(check, q)


@pytest.mark.parametrize("q", [
    "SELECT LTRIM(s), RTRIM(s), TRIM(s) FROM words",
    "SELECT LTRIM(s, 'xy'), RTRIM(s, 'xy'), TRIM(s, 'xy'), TRIM(s, ''), TRIM(s, NULL) FROM words",
    "SELECT TRIM(LEADING 'x' FROM s), TRIM(TRAILING 'x' FROM s) FROM words",
    "SELECT LTRIM('hello', 'ho'), RTRIM('hello', 'ho'), TRIM('papapapa', 'pa'), TRIM(NULL, 'x')",
    "SELECT TRIM(' x' || s || ' ') FROM words",
])
def test_trim_sides_and_characters(check, q):
    check(q)


@pytest.mark.parametrize("q", [
    "SELECT CONCAT('hello', 33, NULL, 22, NULL)",
    "SELECT CONCAT(s, n), CONCAT(n, NULL, s), CONCAT(NULL, NULL) FROM words",
    "SELECT CONCAT(i, k, true, 1.5::DOUBLE) FROM integers",
    "SELECT s || n, n || true FROM words",
    "SELECT CONCAT(0.1::FLOAT, 'x'), 0.1::FLOAT || 'y', CAST(-2.5e7::FLOAT AS VARCHAR), CAST(1e-5::FLOAT AS VARCHAR)",
])
def test_concat_nulls(check, q):
    check(q)


def test_pipe_with_null_literal_is_null(check):
    check("SELECT s || NULL, 'a' || NULL FROM words", types=False)  # DuckDB types it NULL, opforge VARCHAR


@pytest.mark.parametrize("q", [
    "SELECT x FROM ten LIMIT 20 %",
    "SELECT x FROM ten LIMIT 35 PERCENT",
    "SELECT x FROM ten LIMIT 79.9%",
    "SELECT x FROM ten LIMIT (30 - 10) %",
    "SELECT x FROM ten LIMIT 50% OFFSET 7",
    "SELECT x FROM ten ORDER BY x DESC LIMIT 45%",
    "SELECT x FROM ten LIMIT NULL %",
    "SELECT x FROM ten WHERE x > 3 LIMIT 100 PERCENT",
])
def test_limit_percent(check, q):
    check(q, ordered=True)


@pytest.mark.parametrize("q", ["SELECT x FROM ten LIMIT 101%", "SELECT x FROM ten LIMIT x%"])
def test_limit_percent_errors(check, q):
    assert_both_fail(check, q)


@pytest.mark.parametrize("q", [
    "SELECT a.i, a.j, b.i, b.k FROM integers a FULL OUTER JOIN words w ON a.i = w.n"
    " FULL OUTER JOIN integers b ON b.j = w.n UNION ALL SELECT i, j, k, i FROM integers",
    "SELECT i, j, n FROM integers FULL OUTER JOIN words ON i = n"
    " UNION SELECT i + 1, j, n FROM integers FULL OUTER JOIN words ON i = n",
])
def test_full_outer_join_under_union(check, q):
    check(q)


@pytest.mark.parametrize("q", [
    "SELECT i, j FROM integers ORDER BY 2 DESC",
    "SELECT i FROM integers UNION ALL SELECT j FROM integers ORDER BY 1",
    "SELECT i FROM integers ORDER BY -i",
    "SELECT '1e-32768'::DECIMAL, '1e-5'::DECIMAL(10, 4), '1.5e1'::DECIMAL(10, 4)",
])
def test_order_by_positions(check, q):
    check(q, ordered=True)


@pytest.mark.parametrize("q", [
    "WITH c AS (SELECT 1), c AS (SELECT 2) SELECT * FROM c",
    "WITH b AS (SELECT x + 1 FROM a), a AS (SELECT 1 AS x) SELECT * FROM b",
    "SELECT i FROM integers ORDER BY 'hello', i",
    "SELECT i FROM integers ORDER BY 0",
    "SELECT i, j FROM integers ORDER BY -1",
    "SELECT i FROM integers ORDER BY 1.5",
    "SELECT i FROM integers UNION SELECT j FROM integers ORDER BY -1",
    "SELECT i FROM integers UNION SELECT j FROM integers ORDER BY 2",
    "SELECT FROM integers",
    "SELECT '1e-9999999999'::DECIMAL",
    "SELECT '1e-32769'::DECIMAL",
])
def test_statement_errors(check, q):
    assert_both_fail(check, q)


def test_order_by_literal_allowed_by_setting():
    tables = {"integers": TABLES["integers"]}
    check = SqlCheck(tables)
    for con in (check.con, check.duck):
        con.sql("SET order_by_non_integer_literal = true")
    check("SELECT i FROM integers ORDER BY 'hello', i DESC", ordered=True)
    check.con.sql("RESET order_by_non_integer_literal")
    with pytest.raises(sql.SqlError, match="non-integer literal"):
        check.con.sql("SELECT i FROM integers ORDER BY 'hello', i").to_arrow()
