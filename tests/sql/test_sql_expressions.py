"""Scalar expressions on a random table with NULLs in every column, against DuckDB."""
import decimal

import numpy as np
import pytest

from sql_reference import SqlCheck, random_table

EXPRESSIONS = [
    "i + k", "i - b", "i * k", "b * 3", "i / k", "i // 7", "i // (k + 1)", "i % 7", "f % 3", "b % 1000", "-i", "f * 2.5 + i",
    "d + 1", "d - d", "d * 2", "d * d", "d / 3", "d + 0.125", "d * i", "d > 10.5", "d / d",
    "f / 0", "i / 0", "d % 7", "i % d",
    "i > k", "i = k", "d < b * 1000", "d * 2 >= (b + 1) * (b - i)", "d = i", "d * d > d", "i <> k", "f <= i", "d >= i", "s = 'apple'", "s < 'cherry'", "s >= 'b'", "'fig' > s",
    "s = s", "dt < date '1995-01-01'", "dt = dt", "dt - dt", "dt + 30", "dt - 7",
    "i > 0 AND k > 2", "i > 0 OR k > 2", "NOT (i > 0)", "flag AND i > 0", "flag OR s = 'fig'", "NOT flag",
    "i IS NULL", "s IS NOT NULL", "coalesce(i, k, -1)", "coalesce(s, 'none')", "nullif(k, 3)", "nullif(s, 'fig')",
    "CASE WHEN i > 10 THEN 'big' WHEN i < -10 THEN 'small' ELSE s END",
    "CASE WHEN i > 0 THEN d ELSE 0 END", "CASE k WHEN 1 THEN 'one' WHEN 2 THEN 'two' END",
    "CASE WHEN flag THEN f END",
    "CAST(i AS BIGINT)", "CAST(d AS DOUBLE)", "CAST(f AS DECIMAL(12,3))", "CAST(f AS DECIMAL(12,4))", "CAST(f AS INTEGER)", "CAST(d AS INTEGER)", "CAST(i AS DECIMAL(15,3))",
    "CAST(d AS DECIMAL(15,1))", "CAST(i AS DOUBLE) / 3",
    "i BETWEEN -10 AND 10", "dt BETWEEN date '1994-01-01' AND date '1996-12-31'", "s BETWEEN 'b' AND 'd'",
    "k IN (1, 3)", "k NOT IN (1, 3)", "s IN ('apple', 'fig', 'zzz')", "s NOT IN ('apple')", "k IN (1, NULL)",
    "s LIKE 'a%'", "s LIKE '%e%'", "s NOT LIKE '_a%'", "s LIKE 'b\\%x'", "s LIKE 'a_c'", "s LIKE ''",
    "substring(s, 2, 3)", "substring(s from 1 for 2)", "substring(s, 3)", "length(s)", "upper(s)", "lower(s)",
    "s || '-' || s", "s || k", "extract(year from dt)", "extract(month from dt)", "extract(day from dt)",
    "dt + interval '1' month", "dt - interval '3' month", "dt + interval '2' year", "dt - interval '10' day",
    "date '1998-12-01' - interval '90' day", "date '2000-01-31' + interval '1' month",
    "1 + 2 * 3", "0.06 - 0.01", "abs(i)", "round(f, 1)", "round(d, 1)",
    # column <op> literal (kept a Python int): a literal of finer scale, exact or not, an integer column
    # against a decimal literal, an int32 column against literals past its range, the literal on the left
    "d < 10.505", "d <= 10.505", "d > 10.505", "d >= 10.505", "d = 10.505", "d <> 10.505", "d = 10.500",
    "d >= -5000.000", "i < 2.5", "i >= 2.5", "i = 3.0", "i = 2.5", "i <> 2.5", "i > -0.5", "i <= -0.5",
    "i < 3000000000", "i > -3000000000", "i = 3000000000", "i <> 3000000000", "i >= 3000000000",
    "10.505 > d", "3 <= i", "date '1995-06-01' > dt", "b >= 999999999.5", "b < -999999999.25", "k = 2",
    # IN lists of literals in one pass: strings by dictionary codes, numbers at the column's scale, NULLs
    "s NOT IN ('apple', NULL)", "s IN ('zzz')", "s IN (NULL)", "k NOT IN (NULL)", "k NOT IN (2, NULL)",
    "d IN (10.5, -3.25, 7.005)", "i IN (2.5, 3, 3000000000)", "i NOT IN (2.5, 3, -7)",
    "dt IN (date '1995-01-01', date '1996-02-29')", "substring(s, 1, 2) IN ('ap', 'ch', 'zz')",
    # arithmetic with a literal operand kept a Python int (either side, scales aligned, BIGINT checks)
    "1 - d", "(1 - d) * (1 + d)", "d * 1.5", "2.5 * d", "d - 0.001", "0.001 - d", "b - 7", "10 - b",
    "i + 3000000000", "b * 4", "-3 * b", "d * 100", "100 * i",
]


@pytest.fixture(scope="module")
def check():
    return SqlCheck({"t": random_table(np.random.default_rng(11), 300)})


@pytest.mark.parametrize("e", EXPRESSIONS)
def test_expression_matches_duckdb(check, e):
    check(f"SELECT {e} AS x FROM t")


@pytest.mark.parametrize("pred", ["i > 0 AND s LIKE '%a%'", "flag OR i IS NULL", "NOT (k IN (1, 2)) OR d < 0",
                                  "dt >= date '1995-03-15' AND dt < date '1995-03-15' + interval '1' year",
                                  "coalesce(k, 0) = 2", "CASE WHEN k = 1 THEN flag ELSE i < 0 END"])
def test_where_matches_duckdb(check, pred):
    check(f"SELECT k, i, s, d FROM t WHERE {pred}")


def test_select_star_and_constants(check):
    check("SELECT * FROM t")
    check("SELECT 1 AS one, 'x' AS s, 2.50 AS d")
    check("SELECT t.*, i + 1 AS j FROM t")


def test_three_valued_logic_table():
    import pyarrow as pa
    vals = pa.array([True, False, None] * 3)
    other = pa.array([True] * 3 + [False] * 3 + [None] * 3)
    check = SqlCheck({"v": pa.table({"a": vals, "b": other})})
    check("SELECT a AND b, a OR b, NOT a, a IS NULL FROM v", ordered=True)


def test_integer_division_by_zero_raises(check):
    import opforge.sql as sql
    with pytest.raises(sql.SqlError, match="division by zero"):
        check.con.sql("SELECT i % 0 FROM t").to_arrow()


def test_overflow_raises_instead_of_wrapping():
    import pyarrow as pa
    import opforge.sql as sql
    con = sql.connect("cpu").register("o", pa.table({"a": pa.array([2**30, 5], pa.int32()),
                                                     "b": pa.array([2**40, 3], pa.int64())}))
    with pytest.raises(sql.SqlError, match="(?i)overflow"):
        con.sql("SELECT a * 4 FROM o").to_arrow()
    with pytest.raises(sql.SqlError, match="(?i)overflow"):
        con.sql("SELECT b * b FROM o").to_arrow()
    # a sum past int64 is exact in 128 bits (DuckDB's DECIMAL(38,0)), never wrapped
    assert con.sql("SELECT sum(b * 1000000) FROM (SELECT b FROM o UNION ALL SELECT b FROM o) x, "
                   "(SELECT 1 FROM o, o AS o2, o AS o3, o AS o4, o AS o5, o AS o6, o AS o7, o AS o8, o AS o9, o AS o10) y"
                   ).fetchall() == [(decimal.Decimal((2 ** 40 + 3) * 1000000 * 2 * 2 ** 10),)]
    assert con.sql("SELECT a * 1 + 1 AS x FROM o").fetchall() == [(2**30 + 1,), (6,)]
