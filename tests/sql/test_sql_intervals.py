"""Date / timestamp +- INTERVAL (frontend/intervals.py) against DuckDB: every unit, the text form,
amounts computed per row, month ends, NULLs; DATE <-> TIMESTAMP casts. A DATE plus whole days or
months stays a DATE here (DuckDB gives a TIMESTAMP at midnight: compared as that)."""
import datetime

import duckdb
import pyarrow as pa
import pytest

import opforge.sql as sql


@pytest.fixture(scope="module")
def engines():
    t = pa.table({
        "i": pa.array([0, 1, 5, -40, None, 13], pa.int64()),
        "d": pa.array([datetime.date(2024, 1, 31), datetime.date(2024, 2, 29), None, datetime.date(1999, 12, 31),
                       datetime.date(2000, 3, 1), datetime.date(1970, 1, 1)]),
        "ts": pa.array([datetime.datetime(2024, 1, 31, 12, 30), datetime.datetime(2024, 2, 29, 23, 59, 59, 999999),
                        None, datetime.datetime(1969, 12, 31, 0, 0, 1), datetime.datetime(2000, 3, 1),
                        datetime.datetime(2023, 10, 31, 1, 2, 3)], pa.timestamp("us")),
    })
    con, duck = sql.connect("cpu"), duckdb.connect()
    con.register("t", t)
    duck.register("t", t)
    return con, duck


def _midnight(rows):
    return [tuple(datetime.datetime(x.year, x.month, x.day) if type(x) is datetime.date else x for x in r)
            for r in rows]


@pytest.mark.parametrize("query", [
    "SELECT d + INTERVAL 3 DAY, d - INTERVAL '1 month', d + INTERVAL '1 year 2 months', d - INTERVAL 2 WEEK FROM t",
    "SELECT d + INTERVAL (i) DAY, d + INTERVAL (i) MONTH, d - INTERVAL (i) YEAR, d + INTERVAL (i * 2 + 1) WEEK FROM t",
    "SELECT d + INTERVAL 2 HOUR, INTERVAL 1 DAY + d, d + INTERVAL (i) HOUR, d - INTERVAL '90 minutes' FROM t",
    "SELECT ts + INTERVAL 1 HOUR, ts - INTERVAL '90 minutes', ts + INTERVAL (i) DAY, ts + INTERVAL (i) MONTH FROM t",
    "SELECT ts + INTERVAL (i) SECOND, ts - INTERVAL '1 quarter', ts + INTERVAL 250 MILLISECOND FROM t",
    "SELECT (DATE '2025-01-01' + INTERVAL (i) DAY)::TIMESTAMP, ts::DATE, d::TIMESTAMP FROM t",
    "SELECT d + INTERVAL (NULL) DAY FROM t",
    "SELECT d FROM t WHERE d + INTERVAL (i) DAY > DATE '2024-01-31'",
])
def test_interval_arithmetic_matches_duckdb(engines, query):
    con, duck = engines
    assert _midnight(con.sql(query).fetchall()) == _midnight(duck.sql(query).fetchall())


def test_interval_out_of_range_is_an_error(engines):
    con, _ = engines
    with pytest.raises(sql.OutOfRangeError, match="out of range"):
        con.sql("SELECT d + INTERVAL (i * 1000000000) DAY FROM t").fetchall()
    with pytest.raises(sql.NotSupportedError, match="interval unit"):
        con.sql("SELECT d + INTERVAL 3 FORTNIGHT FROM t").fetchall()
