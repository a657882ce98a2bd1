"""Windows without PARTITION BY under a tiny device limit (``sql/outofcore/ordered_window``): the
input externally sorted by the ORDER BY and streamed segment by segment, ranks, running
aggregates, lag / lead, ROWS frames and RANGE frames with offsets carried across segments, ties and
NULLs in the key; a frame without a bound takes its input whole and EXPLAIN ANALYZE says so.
Checked against DuckDB."""

import datetime
import re

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from opforge import sql


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(11)
    n = 3000
    ids = rng.permutation(n)
    k = [None if i % 97 == 0 else int(i // 9) for i in ids]  # ties (peer groups of 9) and NULL keys
    x = [None if v % 5 == 0 else int(v) for v in rng.integers(-50, 100, n)]
    s = [None if i % 31 == 0 else f"w{i % 57:03d}" for i in ids]  # a string key: ties and NULLs
    f = [None if i % 89 == 0 else (i // 5) * 0.25 for i in ids]  # a float key: ties, NULLs
    d = [None if i % 83 == 0 else datetime.date(2020, 1, 1) + datetime.timedelta(days=int(i // 7)) for i in ids]
    ts = [datetime.datetime(2024, 3, 1) + datetime.timedelta(minutes=int(i) * 7) for i in ids]
    return pa.table({"id": ids, "k": pa.array(k, pa.int64()), "x": pa.array(x, pa.int64()), "s": s, "f": f,
                     "d": pa.array(d, pa.date32()), "ts": pa.array(ts, pa.timestamp("us"))})


def _rows(t: pa.Table):
    return sorted(tuple((v is not None, v) for v in r) for r in zip(*[c.to_pylist() for c in t.columns]))


def _check(table, q):
    con = sql.connect("cpu", memory_limit="16KiB")
    con.register("t", table)
    d = duckdb.connect()
    d.register("t", table)
    got, want = con.sql(q).to_arrow(), d.sql(q).to_arrow_table()
    assert got.num_rows == want.num_rows
    assert _rows(got) == _rows(want), q
    return con


def _notes(con, q):
    return [n for s in con.sql(q).analyze().stats for n in s.notes]


ROWS = ("SELECT id, x, row_number() OVER (ORDER BY id) AS rn, lag(x) OVER (ORDER BY id) AS lg, "
        "lead(x, 2, -1) OVER (ORDER BY id) AS ld, lag(x, 700) OVER (ORDER BY id) AS far, "
        "lead(id, 650) OVER (ORDER BY id) AS ahead, "
        "sum(x) OVER (ORDER BY id ROWS BETWEEN 3 PRECEDING AND 1 FOLLOWING) AS s, "
        "min(x) OVER (ORDER BY id ROWS BETWEEN 2 PRECEDING AND 2 FOLLOWING) AS lo, "
        "first_value(x) OVER (ORDER BY id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS fv, "
        "max(x) OVER (ORDER BY id ROWS UNBOUNDED PRECEDING) AS hi FROM t")
TIES = ("SELECT id, k, x, rank() OVER (ORDER BY k NULLS FIRST) AS r, dense_rank() OVER (ORDER BY k) AS dr, "
        "count(x) OVER (ORDER BY k) AS c, count(*) OVER (ORDER BY k) AS n, sum(x) OVER (ORDER BY k) AS s, "
        "max(x) OVER (ORDER BY k DESC) AS hi FROM t WHERE id > 20")
STRINGS = ("SELECT id, s, rank() OVER (ORDER BY s DESC NULLS FIRST) AS r, count(*) OVER (ORDER BY s DESC) AS c, "
           "round(percent_rank() OVER (ORDER BY s), 9) AS pr, round(cume_dist() OVER (ORDER BY s), 9) AS cd, "
           "ntile(7) OVER (ORDER BY id) AS nt, "
           "lag(s, 3, 'zz') OVER (ORDER BY id DESC) AS l FROM t")

# RANGE offsets: frames by key across segments (the offsets reach up to ~400 rows, a segment holds
# ~100), both directions, NULLs first and last, frames wholly before / after the row, a float key
RANGE = ("SELECT id, k, x, sum(x) OVER (ORDER BY k RANGE BETWEEN 3 PRECEDING AND 2 FOLLOWING) AS s, "
         "count(*) OVER (ORDER BY k DESC RANGE BETWEEN 10 PRECEDING AND 1.5 FOLLOWING) AS c, "
         "min(x) OVER (ORDER BY k NULLS FIRST RANGE BETWEEN CURRENT ROW AND 40 FOLLOWING) AS lo, "
         "max(id) OVER (ORDER BY k RANGE BETWEEN 5 PRECEDING AND 2 PRECEDING) AS before_hi, "
         "count(x) OVER (ORDER BY k DESC NULLS FIRST RANGE BETWEEN 1 FOLLOWING AND 4 FOLLOWING) AS after_n, "
         "first_value(x) OVER (ORDER BY id RANGE BETWEEN 7 PRECEDING AND 3 FOLLOWING) AS fv, "
         "lead(x, 2) OVER (ORDER BY id) AS ld FROM t")
RANGE_FLOAT = ("SELECT id, f, avg(x) OVER (ORDER BY f RANGE BETWEEN 2.5 PRECEDING AND 0.75 FOLLOWING) AS a, "
               "max(x) OVER (ORDER BY f DESC RANGE BETWEEN 0.25 PRECEDING AND CURRENT ROW) AS hi, "
               "count(*) OVER (ORDER BY f RANGE BETWEEN 0 PRECEDING AND 0 FOLLOWING) AS peers FROM t")

RANGE_INTERVAL = ("SELECT id, d, ts, sum(x) OVER (ORDER BY d RANGE BETWEEN INTERVAL 3 DAYS PRECEDING AND CURRENT ROW) AS s, "
                  "count(*) OVER (ORDER BY d DESC RANGE BETWEEN INTERVAL '1 week' PRECEDING "
                  "AND INTERVAL 2 DAY FOLLOWING) AS c, "
                  "max(x) OVER (ORDER BY ts RANGE BETWEEN INTERVAL 90 MINUTE PRECEDING "
                  "AND INTERVAL '1 hour 30 seconds' FOLLOWING) AS hi FROM t")


@pytest.mark.parametrize("q", [ROWS, TIES, STRINGS, RANGE, RANGE_FLOAT, RANGE_INTERVAL],
                         ids=["rows-frames", "ties-and-nulls", "strings", "range-offsets", "range-float-key",
                              "range-interval"])
def test_ordered_window_streams_and_matches_duckdb(table, q):
    con = _check(table, q)
    notes = " ".join(_notes(con, q))
    assert "window without PARTITION BY over an external sort" in notes, notes
    segments = [int(w) for w in re.findall(r"streamed in (\d+) segments", notes)]
    assert segments and min(segments) > 1 and "takes its input whole" not in notes, notes


def test_unbounded_frame_takes_its_input_whole_and_says_so(table):
    q = "SELECT id, sum(x) OVER (ORDER BY id ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS s FROM t"
    con = _check(table, q)
    assert any("takes its input whole" in n and "UNBOUNDED FOLLOWING" in n for n in _notes(con, q))


def test_range_offset_read_from_the_row_takes_its_input_whole(table):
    q = "SELECT id, sum(x) OVER (ORDER BY k RANGE BETWEEN abs(x) PRECEDING AND CURRENT ROW) AS s FROM t WHERE x IS NOT NULL"
    con = _check(table, q)
    assert any("takes its input whole" in n and "RANGE" in n for n in _notes(con, q))


def test_range_interval_in_memory_and_refusals(table):
    con, d = sql.connect("cpu"), duckdb.connect()
    con.register("t", table)
    d.register("t", table)
    assert _rows(con.sql(RANGE_INTERVAL).to_arrow()) == _rows(d.sql(RANGE_INTERVAL).to_arrow_table())
    with pytest.raises(sql.NotSupportedError, match="no months or years"):
        con.sql("SELECT sum(x) OVER (ORDER BY d RANGE BETWEEN INTERVAL 1 MONTH PRECEDING AND CURRENT ROW) FROM t")
    with pytest.raises(sql.NotSupportedError, match="whole days only"):
        con.sql("SELECT sum(x) OVER (ORDER BY d RANGE BETWEEN INTERVAL 36 HOUR PRECEDING AND CURRENT ROW) FROM t")
    with pytest.raises(sql.SqlError, match="needs a DATE or TIMESTAMP"):
        con.sql("SELECT sum(x) OVER (ORDER BY k RANGE BETWEEN INTERVAL 1 DAY PRECEDING AND CURRENT ROW) FROM t")
