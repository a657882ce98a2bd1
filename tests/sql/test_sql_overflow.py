"""Issue 25: integer and DECIMAL arithmetic, narrowing casts, abs / unary minus and sum raise an
out-of-range error instead of wrapping around (DuckDB, the peer, raises too); results that fit are
returned exactly. Every case runs on a column (the device path) and DuckDB on the same Arrow table."""
import decimal

import duckdb
import pyarrow as pa
import pytest

import opforge.sql as sql
from opforge.sql.errors import ConversionError, OutOfRangeError

I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1
I64_MIN, I64_MAX = -2 ** 63, 2 ** 63 - 1


def _table() -> pa.Table:
    return pa.table({
        "price": pa.array([decimal.Decimal("99999999.99"), decimal.Decimal("9999999999.99")], pa.decimal128(12, 2)),
        "d": pa.array([decimal.Decimal("99999999.99"), decimal.Decimal("1.00")], pa.decimal128(10, 2)),
        "big": pa.array([I64_MAX, I64_MIN], pa.int64()),
        "i": pa.array([I32_MIN, I32_MAX], pa.int32()),
        "f": pa.array([float("inf"), float("nan")], pa.float64()),
        "g": pa.array([1e30, -1.5], pa.float64()),
        "one": pa.array([1, 1], pa.int64()),
    })


@pytest.fixture(scope="module")
def engines():
    t = _table()
    con, duck = sql.connect("cpu"), duckdb.connect()
    con.register("t", t)
    duck.register("t", t)
    return con, duck


def _both_raise(engines, query: str, error, match: str):
    con, duck = engines
    with pytest.raises(duckdb.Error):
        duck.sql(query).fetchall()
    with pytest.raises(error, match=match):
        con.sql(query).to_arrow()


@pytest.mark.parametrize("query, match", [
    # DECIMAL(10,2) * DECIMAL(10,2) is DECIMAL(18,4) (DuckDB's rule): the product has 20 digits
    ("SELECT CAST(99999999.99 AS DECIMAL(10,2)) * CAST(99999999.99 AS DECIMAL(10,2))",
     r"Overflow in multiplication of DECIMAL\(18\) \(9999999999 \* 9999999999\)"),
    ("SELECT d * d FROM t", r"Overflow in multiplication of DECIMAL\(18\) \(9999999999 \* 9999999999\)"),
    ("SELECT price * 1000000000 FROM t", r"Overflow in multiplication of DECIMAL\(18\)"),
    ("SELECT price * CAST(1.5 AS DECIMAL(18,8)) FROM t", r"Overflow in multiplication of DECIMAL\(18\)"),
    ("SELECT d * CAST(1.5 AS DECIMAL(18,8)) FROM t", r"Overflow in multiplication of DECIMAL\(18\)"),
])
def test_decimal_multiplication_overflow_raises(engines, query, match):
    _both_raise(engines, query, OutOfRangeError, match)


def test_decimal_multiplication_that_fits_is_exact(engines):
    con, duck = engines
    q = "SELECT d * CAST(1.5 AS DECIMAL(18,8)) AS x FROM t WHERE d < 10"
    mine, ref = con.sql(q).to_arrow(), duck.sql(q).arrow().read_all()
    assert mine.schema.field("x").type == ref.schema.field("x").type == pa.decimal128(18, 10)
    assert mine.column("x").to_pylist() == ref.column("x").to_pylist() == [decimal.Decimal("1.5")]
    q = "SELECT CAST(999999999 AS DECIMAL(10,0)) * CAST(1000000000 AS DECIMAL(10,0)) AS x"
    assert con.sql(q).to_arrow().column("x").to_pylist() == [decimal.Decimal(999999999000000000)]


@pytest.mark.parametrize("query, match", [
    ("SELECT big + one FROM t", r"Overflow in addition of INT64"),
    ("SELECT big - one FROM t WHERE big < 0", r"Overflow in subtraction of INT64"),
    ("SELECT big * 2 FROM t", r"Overflow in multiplication of INT64"),
    ("SELECT big * -1 FROM t WHERE big < 0", r"Overflow in multiplication of INT64"),
    ("SELECT i + 1 FROM t WHERE i > 0", r"Overflow in addition of INT32"),
    ("SELECT i * i FROM t", r"Overflow in multiplication of INT32"),
    ("SELECT -big FROM t WHERE big < 0", r"Overflow in negation"),
    ("SELECT -i FROM t WHERE i < 0", r"Overflow in negation"),
    ("SELECT abs(big) FROM t", r"Overflow on abs\(-9223372036854775808\)"),
    ("SELECT abs(i) FROM t", r"Overflow on abs\(-2147483648\)"),
    # the hardware traps on INT64_MIN / -1 (SIGFPE): a crash of the process before the fix
    ("SELECT big // -1 FROM t WHERE big < 0", r"Overflow in division of -9223372036854775808 / -1"),
    ("SELECT i // CAST(-1 AS INTEGER) FROM t", r"Overflow in division of -2147483648 / -1"),
])
def test_integer_overflow_raises(engines, query, match):
    _both_raise(engines, query, OutOfRangeError, match)


@pytest.mark.parametrize("query, match", [
    ("SELECT CAST(big AS INTEGER) FROM t WHERE big > 0",
     "Type INT64 with value 9223372036854775807 can't be cast because the value is out of range "
     "for the destination type INT32"),
    ("SELECT CAST(f AS INTEGER) FROM t WHERE f > 0", "Type DOUBLE with value inf can't be cast"),
    ("SELECT CAST(f * 0 AS BIGINT) FROM t", "Type DOUBLE with value nan can't be cast"),
    ("SELECT CAST(g AS BIGINT) FROM t", r"Type DOUBLE with value 1e\+30 can't be cast"),
    ("SELECT CAST(big AS DECIMAL(18,0)) FROM t", "Could not cast value 9223372036854775807 to DECIMAL"),
    ("SELECT CAST(i AS DECIMAL(4,0)) FROM t", r"Could not cast value -2147483648 to DECIMAL\(4,0\)"),
    ("SELECT CAST(price AS DECIMAL(5,1)) FROM t", r"to type DECIMAL\(5,1\) failed: value is out of range"),
    ("SELECT CAST(g AS DECIMAL(18,2)) FROM t", r"Could not cast value .* to DECIMAL\(18,2\)"),
    ("SELECT CAST(price AS INTEGER) FROM t", "Failed to cast decimal value .* to type INT32"),
])
def test_narrowing_cast_out_of_range_raises(engines, query, match):
    _both_raise(engines, query, ConversionError, match)


def test_remainder_by_minus_one_is_zero(engines):
    con, duck = engines
    q = "SELECT big % -1 AS a, i % CAST(-1 AS INTEGER) AS b, big // 2 AS c FROM t"
    assert con.sql(q).fetchall() == duck.sql(q).fetchall() == [(0, 0, I64_MAX // 2), (0, 0, I64_MIN // 2)]


@pytest.mark.parametrize("query", [
    "SELECT CASE WHEN big > 0 THEN 0 ELSE big + 1 END AS x FROM t",
    "SELECT CASE WHEN big > 0 THEN 1 WHEN big + 1 < 0 THEN 2 ELSE 3 END AS x FROM t",
    "SELECT CASE WHEN d < 10 THEN d * CAST(1.5 AS DECIMAL(18,8)) END AS x FROM t",
    "SELECT CASE WHEN f > 0 AND f < 1e308 THEN CAST(f AS INTEGER) ELSE -1 END AS x FROM t",
])
def test_case_branch_not_taken_raises_nothing(engines, query):
    """Rows that do not take a CASE branch are not range-checked there (DuckDB evaluates a branch on its rows)."""
    con, duck = engines
    assert con.sql(query).fetchall() == duck.sql(query).fetchall()


def test_case_branch_taken_still_raises(engines):
    _both_raise(engines, "SELECT CASE WHEN big < 0 THEN big - 1 ELSE 0 END FROM t", OutOfRangeError,
                "Overflow in subtraction of INT64")


def test_cast_rounds_like_duckdb():
    """DOUBLE -> integer rounds half to even (DuckDB's nearbyint), DECIMAL -> integer half away from zero."""
    t = pa.table({"x": pa.array([2.5, -2.5, 1.5, 0.5, -0.5, 2147483647.4], pa.float64()),
                  "d": pa.array([decimal.Decimal(v) for v in ("2.5", "-2.5", "1.5", "0.5", "-0.5", "12.4")],
                                pa.decimal128(4, 1))})
    con, duck = sql.connect("cpu"), duckdb.connect()
    con.register("t", t)
    duck.register("t", t)
    q = "SELECT CAST(x AS INTEGER) AS a, CAST(x AS BIGINT) AS b, CAST(d AS INTEGER) AS c, CAST(x AS DECIMAL(11,0)) AS e FROM t"
    assert con.sql(q).fetchall() == duck.sql(q).fetchall()


def test_sum_overflow_is_exact():
    t = pa.table({"x": pa.array([I64_MIN, I64_MIN, 5], pa.int64()), "y": pa.array([I64_MAX, 0, 0], pa.int64()),
                  "z": pa.array([I64_MAX, 1, -2], pa.int64()), "k": pa.array([1, 2, 1], pa.int32())})
    con = sql.connect("cpu")
    con.register("t", t)
    # a sum that fits the int64 storage is returned exactly (DuckDB: 9223372036854775807)
    assert con.sql("SELECT sum(y) FROM t").fetchall() == [(decimal.Decimal(I64_MAX),)]
    # partial sums pass the limit, the total does not: the exact (two-halves) path
    assert con.sql("SELECT sum(z) FROM t").fetchall() == [(decimal.Decimal(I64_MAX - 1),)]
    assert sorted(con.sql("SELECT k, sum(z) FROM t GROUP BY k").fetchall()) == [
        (1, decimal.Decimal(I64_MAX - 2)), (2, decimal.Decimal(1))]
    # -2^64 + 5 leaves int64: the 128-bit sum is exact (DuckDB: -18446744073709551611), never 5
    assert con.sql("SELECT sum(x) FROM t").fetchall() == [(decimal.Decimal(2 * I64_MIN + 5),)]
    assert sorted(con.sql("SELECT k, sum(x) FROM t GROUP BY k").fetchall()) == [
        (1, decimal.Decimal(I64_MIN + 5)), (2, decimal.Decimal(I64_MIN))]


def test_sums_of_one_operator_share_one_bounds_read_and_stay_exact(monkeypatch):
    """An aggregate operator sums every integer / DECIMAL column in int64 at once and reads all their
    overflow bounds back together; the sums whose bound fails (here x, z and the 128-bit w) are
    summed again exactly, the others are kept. Answers equal DuckDB's."""
    import torch

    big = decimal.Decimal(10) ** 20
    t = pa.table({"x": pa.array([I64_MIN, I64_MIN, 5, 7], pa.int64()), "y": pa.array([3, 0, -4, 9], pa.int64()),
                  "z": pa.array([I64_MAX, 1, -2, None], pa.int64()),
                  "w": pa.array([big, big, decimal.Decimal(1), None], pa.decimal128(38, 0)),
                  "v": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("-2.25"), decimal.Decimal("4.00")],
                                pa.decimal128(30, 2)),
                  "k": pa.array([1, 2, 1, 2], pa.int32())})
    con, duck = sql.connect("cpu"), duckdb.connect()
    con.register("t", t)
    duck.register("t", t)
    q = ("SELECT k, sum(x), sum(y), sum(z), sum(w), sum(v), avg(w), avg(v), count(z), sum(y * 2) FROM t "
         "GROUP BY k ORDER BY k")
    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self.shape) or tolist(self))
    got = con.sql(q).fetchall()
    monkeypatch.undo()
    assert got == duck.sql(q).fetchall()
    # the bounds of the six SUMs and two 128-bit AVGs (8 x 3 scalars), the largest group and the
    # results' NULL-mask checks: one read
    assert any(len(shape) == 1 and shape[0] >= 25 for shape in reads), reads
    assert con.sql("SELECT sum(x), sum(y), sum(w) FROM t").fetchall() == \
        duck.sql("SELECT sum(x), sum(y), sum(w) FROM t").fetchall()


def test_range_checks_are_read_back_once_per_evaluation(monkeypatch):
    """Every check of one expression evaluation is one host read (``evaluation.raise_failed``), not
    one per operation; checks that the operand types make impossible are not even recorded."""
    import torch

    from opforge.sql import types as T
    from opforge.sql.column import Column
    from opforge.sql.expr import Batch, Func, Ref, evaluate, evaluation

    reads = []
    real = evaluation.raise_failed
    monkeypatch.setattr(evaluation, "raise_failed", lambda checks: (reads.append(len(checks)), real(checks))[1])
    x = Ref(1, T.INT64, "x")
    d = Ref(2, T.decimal(9, 2), "d")
    batch = Batch({1: Column(torch.tensor([1, I64_MAX]), None, T.INT64),
                   2: Column(torch.tensor([100, -5]), None, T.decimal(9, 2))}, 2, torch.device("cpu"))
    e = Func("arith", [Func("arith", [x, x], T.INT64, "-"), Func("neg", [x], T.INT64)], T.INT64, "+")
    evaluate(e, batch)
    assert reads == [3]
    # DECIMAL(9,2) * DECIMAL(9,2) has at most 18 digits, and their sum with a DECIMAL(9,2) at most 19: its
    # DECIMAL(19,4) (128-bit storage) holds every such value, so nothing is checked
    evaluate(Func("arith", [Func("arith", [d, d], T.decimal(18, 4), "*"), d], T.decimal(19, 4), "+"), batch)
    assert reads == [3, 0]
    with pytest.raises(OutOfRangeError, match=r"Overflow in addition of INT64 \(9223372036854775807 \+ 1\)"):
        evaluate(Func("arith", [Func("neg", [Func("neg", [x], T.INT64)], T.INT64), Ref(3, T.INT64, "y")], T.INT64, "+"),
                 Batch({1: Column(torch.tensor([5, I64_MAX]), None, T.INT64),
                        3: Column(torch.tensor([1, 1]), None, T.INT64)}, 2, torch.device("cpu")))


def test_aggregates_over_no_rows_and_null_groups_equal_duckdb():
    """The NULL masks of one operator's results are checked together after the aggregates: a group
    whose values are all NULL, and an aggregate over no rows, stay NULL (DuckDB's answers)."""
    t = pa.table({"k": pa.array([1, 1, 2, 3], pa.int32()), "x": pa.array([None, None, 4, 5], pa.int64()),
                  "d": pa.array([None, None, decimal.Decimal("1.5"), None], pa.decimal128(30, 1)),
                  "f": pa.array([1.0, None, None, 2.0], pa.float64())})
    con, duck = sql.connect("cpu"), duckdb.connect()
    con.register("t", t)
    duck.register("t", t)
    for q in ("SELECT k, sum(x), min(x), avg(d), sum(d), max(f), count(x), count(*) FROM t GROUP BY k ORDER BY k",
              "SELECT sum(x), avg(d), count(*), max(f) FROM t WHERE k > 5",
              "SELECT sum(x), sum(d), min(f) FROM t"):
        assert con.sql(q).fetchall() == duck.sql(q).fetchall(), q
