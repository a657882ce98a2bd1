"""DECIMAL(19..38) and HUGEINT in 128-bit storage (sql/decimal128.py, expr/decimal_wide.py): the
integer kernels against Python ints, and queries against DuckDB (values and result types)."""
import decimal
import random

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import opforge.sql as sql
from opforge.sql import decimal128 as D

from sql_reference import SqlCheck

BIG = decimal.Decimal("123456789012345678901234567890.12")


# -- the 128-bit kernels -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ints():
    rng = random.Random(7)
    edge = [0, 1, -1, 2 ** 63, -2 ** 63, 2 ** 63 - 1, 2 ** 64 - 1, -2 ** 64, 10 ** 38 - 1, -(10 ** 38 - 1)]
    a = edge + [rng.randint(-10 ** k, 10 ** k) for k in (5, 18, 19, 30, 38) for _ in range(40)]
    b = [rng.randint(-10 ** k, 10 ** k) for k in (1, 9, 19, 20, 38) for _ in range(42)]
    return a, b[:len(a)]


def test_add_sub_neg_compare_match_python_ints(ints):
    a, b = ints
    x, y = D.from_ints(a, "cpu"), D.from_ints(b, "cpu")
    assert D.to_ints(x) == a
    for fn, ref in ((D.add, lambda p, q: p + q), (D.sub, lambda p, q: p - q)):
        out, over = fn(x, y)
        exp = [ref(p, q) for p, q in zip(a, b)]
        assert over.tolist() == [not -2 ** 127 <= e < 2 ** 127 for e in exp]
        assert [r for r, o in zip(D.to_ints(out), over.tolist()) if not o] == [e for e, o in zip(exp, over.tolist()) if not o]
    assert D.to_ints(D.neg(x)) == [-p for p in a]
    for op, ref in (("<", int.__lt__), ("<=", int.__le__), ("=", int.__eq__), (">", int.__gt__)):
        assert D.compare(op, x, y).tolist() == [ref(p, q) for p, q in zip(a, b)]
        assert D.compare(op, x, x).tolist() == [ref(p, p) for p in a]


def test_mul_and_its_overflow_match_python_ints(ints):
    a, b = ints
    out, over = D.mul(D.from_ints(a, "cpu"), D.from_ints(b, "cpu"))
    exp = [p * q for p, q in zip(a, b)]
    assert over.tolist() == [abs(e) >= 2 ** 127 for e in exp]
    assert all(r == e for r, e, o in zip(D.to_ints(out), exp, over.tolist()) if not o)


def test_rescale_rounds_half_away_from_zero(ints):
    a, _ = ints
    x = D.from_ints(a, "cpu")

    def ref(v, k):
        q, r = divmod(abs(v), 10 ** k)
        q += 2 * r >= 10 ** k
        return q if v >= 0 else -q
    for k in (1, 9, 10, 19, 37):
        assert D.to_ints(D.div_pow10(x, k)) == [ref(v, k) for v in a]
    small = [v for v in a if abs(v) < 10 ** 18]
    assert D.to_ints(D.scale_up(D.from_ints(small, "cpu"), 20)) == [v * 10 ** 20 for v in small]


def test_ranks_floats_and_group_sums_match_python(ints):
    a, _ = ints
    x = D.from_ints(a, "cpu")
    rank, uniques = D.dense_rank(x)
    distinct = sorted(set(a))
    assert D.to_ints(uniques) == distinct and [distinct[r] for r in rank.tolist()] == a
    assert D.fits_int64(x).tolist() == [-2 ** 63 <= v < 2 ** 63 for v in a]
    assert all(f == float(v) or abs(f - v) <= abs(v) * 2 ** -52 for f, v in zip(D.to_float64(x).tolist(), a))
    fl = torch.tensor([float(v) for v in a], dtype=torch.float64)
    assert D.to_ints(D.from_float64(fl)) == [int(float(v)) for v in a]
    small = [v for v in a if abs(v) < 10 ** 30]
    gid = torch.tensor([i % 3 for i in range(len(small))])
    sums, over = D.segment_sum(D.from_ints(small, "cpu"),
                               lambda limb: torch.zeros(3, dtype=torch.int64).index_add_(0, gid, limb))
    assert not over.any() and D.to_ints(sums) == [sum(small[g::3]) for g in range(3)]
    half_even = D.div_count_half_even(D.from_ints([5, 7, -7, -2 ** 127], "cpu"), torch.tensor([2, 2, 2, 2]))
    assert D.to_ints(half_even) == [2, 4, -4, -2 ** 126]


def test_exceeds_and_scaled_doubles_match_python(ints):
    a, _ = ints
    x = D.from_ints(a, "cpu")
    for bound in (1, 10 ** 18, 2 ** 63, 2 ** 64, 10 ** 37 + 3, 10 ** 38):
        assert D.exceeds(x, bound).tolist() == [abs(v) >= bound for v in a]
    in_38 = [v for v in a if abs(v) < 10 ** 38]
    y = D.from_ints(in_38, "cpu")
    for s in (1, 4, 9, 10, 20):  # the integer and fractional parts apart, each rounded once (the docstring)
        exp = [(-1 if v < 0 else 1) * (float(abs(v) // 10 ** s) + float(abs(v) % 10 ** s) / 10.0 ** s) for v in in_38]
        got = D.to_float64_scaled(y, s).tolist()
        assert all(g == e or abs(g - e) <= abs(e) * 2 ** -51 for g, e in zip(got, exp)), s


# -- queries against DuckDB -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def check():
    dec = [BIG, decimal.Decimal("-5.25"), None, BIG, decimal.Decimal("0.01"), -BIG, decimal.Decimal("99999999999.99")]
    t = pa.table({
        "k": pa.array([1, 2, 1, 3, 2, 3, 1], pa.int32()),
        "d": pa.array(dec, pa.decimal128(38, 2)),
        "e": pa.array([decimal.Decimal(x) for x in ("1.50000", "2.5", "-1.25", "100.01", "0", "7", "1e-5")],
                      pa.decimal128(25, 5)),
        "n": pa.array([decimal.Decimal(x) for x in ("1.5", "2.5", "3", "-4", "5", "6.25", "7")], pa.decimal128(10, 2)),
    })
    u = pa.table({"d": pa.array([BIG, decimal.Decimal("-5.25"), decimal.Decimal(7)], pa.decimal128(34, 2)),
                  "name": ["big", "neg", "seven"]})
    return SqlCheck({"t": t, "u": u})


@pytest.mark.parametrize("query", [
    "SELECT k, d, e, n FROM t",
    "SELECT d + n, d - e, e * n, d * n, -d, abs(d), d / n FROM t",
    "SELECT d % 7, e % 0.3, n % CAST(2 AS BIGINT), round(k * 0.333, 0) % 3 FROM t",
    "SELECT CAST(d AS DOUBLE), CAST(e AS BIGINT), CAST(n AS DECIMAL(30, 4)), CAST(d AS VARCHAR) FROM t",
    "SELECT d FROM t WHERE d > 1000 OR d < e",
    "SELECT d FROM t WHERE d = 0.01 OR d IN (-5.25, 7)",
    "SELECT k FROM t GROUP BY k HAVING sum(n) > 3 AND sum(n) <> 8.25 AND 0.001 < sum(e)",
    "SELECT k FROM t WHERE e > 7 OR d < -5 OR d > 12345678901234567890123.456",
    "SELECT CASE WHEN k = 1 THEN d ELSE e END, coalesce(d, n) FROM t",
    "SELECT k, sum(d), min(d), max(d), count(d), sum(e), avg(e), decimal_average(d) FROM t GROUP BY k",
    "SELECT sum(d), min(e), max(e), count(DISTINCT d) FROM t",
    "SELECT k, first(d), first(n) FROM t GROUP BY k",
    "SELECT d, count(*) FROM t GROUP BY d",
    "SELECT DISTINCT e FROM t",
    "SELECT t.k, u.name FROM t JOIN u ON t.d = u.d",
    "SELECT t.k, u.name FROM t LEFT JOIN u ON t.d = u.d",
    "SELECT CAST('4567645908450368043562342564564938245.1' AS DECIMAL(38,1)), CAST('1e37' AS DECIMAL(38,0))",
    "SELECT 12345678901234567890123 * 10, CAST(1 AS HUGEINT) + 0.5",
    # text of small values: plain digits, never Python's exponent form ('0E-10', '1.000E-7')
    "SELECT CAST(CAST(0 AS DECIMAL(18,10)) AS VARCHAR), CAST(CAST(0.0000001 AS DECIMAL(38,10)) AS VARCHAR), "
    "CAST(CAST(-0.00001 AS DECIMAL(9,8)) AS VARCHAR)",
    "SELECT x.k, x.s FROM (SELECT k, sum(n) AS s FROM t GROUP BY k) x JOIN (SELECT k, sum(n) AS s FROM t GROUP BY k) y "
    "ON x.s = y.s WHERE x.s > 2",
    "SELECT k, sum(n) OVER (PARTITION BY k), max(n) OVER (ORDER BY n ROWS 1 PRECEDING) FROM t",
])
def test_queries_match_duckdb(check, query):
    check(query)


@pytest.fixture(scope="module")
def edge():
    """SUMs whose values fit int64 by a little or not at all: the int64 paths of 128-bit products,
    comparisons and casts to DOUBLE (decimal_wide._narrow) against the 128-bit ones."""
    big = [2 ** 62, 2 ** 62 - 1, -(2 ** 62), 3, None, 2 ** 31, -7]
    return SqlCheck({"w": pa.table({
        "g": pa.array([1, 1, 2, 2, 3, 3, 4], pa.int32()),
        "b": pa.array(big, pa.int64()),
        "p": pa.array([decimal.Decimal(x) for x in ("9223372036.85477580", "0.00000001", "-1.5", "2.5", "0", "1", "-3")],
                      pa.decimal128(18, 8)),
        "q": pa.array([decimal.Decimal(x) for x in ("1.25", "-2.50", "3037000499.97", "3037000500.00", "0.01", "7", "-7")],
                      pa.decimal128(15, 2)),
    })})


@pytest.mark.parametrize("query", [
    # |sum| * |factor| around 2^63: int64 below, exact 128 bits above (never a wrapped product)
    "SELECT g, sum(b) * 2, sum(b) * 3, sum(b) * sum(b), 100.00 * sum(q), sum(q) * sum(q), sum(p) * sum(q) FROM w GROUP BY g",
    "SELECT g, sum(q) * sum(q) * sum(q) FROM w GROUP BY g",
    "SELECT g, sum(b) * 2, sum(b) * sum(b), sum(p) * sum(q), sum(p) * 1000000 FROM w WHERE g > 1 GROUP BY g",
    # comparisons at different scales, int64 while both sides scaled fit, 128 bits past it
    "SELECT g, sum(p) > sum(q), sum(q) = sum(q), sum(b) < sum(q), sum(b) >= sum(p), sum(p) <> 0.5 * sum(q) "
    "FROM w GROUP BY g",
    "SELECT g FROM w GROUP BY g HAVING sum(q) > (SELECT 0.0001 * sum(q) FROM w)",
    "SELECT g, sum(b) < sum(q), sum(b) >= sum(p), sum(p) > sum(q) FROM w WHERE g > 1 GROUP BY g",
    # casts to DOUBLE: the same doubles from the int64 parts as from the 128-bit long division
    "SELECT g, sum(p) / sum(q), CAST(sum(p) AS DOUBLE), CAST(sum(q) AS REAL), 100.00 * sum(q) / sum(p) FROM w GROUP BY g",
])
def test_int64_paths_of_128_bit_values_match_duckdb(edge, query):
    edge(query)


def test_order_by_and_top_n_match_duckdb(check):
    check("SELECT k, d FROM t ORDER BY d DESC NULLS LAST, k", ordered=True)
    check("SELECT d FROM t ORDER BY d LIMIT 3", ordered=True)
    check("SELECT k, sum(n) AS s FROM t GROUP BY k ORDER BY s DESC", ordered=True)


@pytest.mark.parametrize("query, error, match", [
    ("SELECT CAST(10.00 AS DECIMAL(4,2))::DECIMAL(38,37)", sql.ConversionError, "out of range"),
    ("SELECT CAST(d AS DECIMAL(20,2)) FROM t", sql.ConversionError, "out of range"),
    ("SELECT CAST(d AS BIGINT) FROM t", sql.ConversionError, "Failed to cast decimal value"),
    ("SELECT CAST(99999999999999999999999999999999999999 AS DECIMAL(38,0)) + 1", sql.OutOfRangeError,
     "Overflow in addition of DECIMAL"),
    ("SELECT d * d FROM t", sql.OutOfRangeError, "Overflow in multiplication"),
    ("SELECT CAST(0.5 AS DECIMAL(38,30)) * CAST(0.5 AS DECIMAL(38,30))", sql.OutOfRangeError, "Needed scale 60"),
])
def test_out_of_range_is_an_error_naming_the_value(check, query, error, match):
    with pytest.raises(error, match=match):
        check.con.sql(query).fetchall()
    with pytest.raises(duckdb.Error):
        check.duck.sql(query).fetchall()


def test_sum_beyond_38_digits_is_an_error():
    con = sql.connect("cpu")
    con.sql("CREATE TABLE big (v DECIMAL(38,0))")
    con.sql("INSERT INTO big VALUES (99999999999999999999999999999999999999), (99999999999999999999999999999999999999)")
    with pytest.raises(sql.OutOfRangeError):
        con.sql("SELECT sum(v) FROM big").fetchall()
    with pytest.raises(sql.OutOfRangeError, match="HUGEINT"):
        con.sql("SELECT decimal_average(v) FROM big").fetchall()


def test_parquet_decimal128_round_trip(tmp_path):
    values = [BIG, None, decimal.Decimal("-0.01")]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"x": pa.array(values, pa.decimal128(32, 2))}), path)
    con = sql.connect("cpu")
    con.register("p", str(path))
    out = con.sql("SELECT x, x * 2 AS y FROM p").to_arrow()
    assert out.schema.field("x").type == pa.decimal128(32, 2) and out.column("x").to_pylist() == values
    assert out.column("y").to_pylist() == [decimal.Decimal("246913578024691357802469135780.24"), None,
                                           decimal.Decimal("-0.02")]


@pytest.mark.triton_kernels
def test_hash_kernels_on_128_bit_columns(check):
    """The Triton group-by / segment-reduce / hash-join kernels (interpreted on the CPU) read plain
    int64 buffers: a 128-bit column reaches them as contiguous words, never a strided view."""
    check("SELECT k, sum(d), min(d), max(d), sum(n), min(e) FROM t GROUP BY k")
    check("SELECT x.k, x.s FROM (SELECT k, sum(n) AS s FROM t GROUP BY k) x JOIN u ON x.s * 0 + 7 = u.d")
    check("SELECT t.k, u.name FROM t JOIN u ON t.d = u.d")
