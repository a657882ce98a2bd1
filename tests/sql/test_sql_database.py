"""SQL as a database (issue 28): tables that persist in a folder, COPY, read_parquet / read_csv in
FROM, and prepared parameters; every answer is compared with DuckDB doing the same."""
import datetime
import decimal
import os

import duckdb
import pyarrow as pa
import pytest

import opforge
import opforge.sql as sql
from opforge.sql.database import DATA
from opforge.sql.errors import SqlError

SETUP = [
    "CREATE TABLE t(i INTEGER PRIMARY KEY, s VARCHAR DEFAULT 'dflt', d DECIMAL(6,2), f DOUBLE, day DATE)",
    "INSERT INTO t VALUES (1, 'a', 1.25, 0.5, DATE '2024-01-02'), (2, NULL, NULL, NULL, NULL)",
    "INSERT INTO t (i) VALUES (3)",
    "INSERT INTO t SELECT i + 10, s, d, f, day FROM t",
    "CREATE TABLE agg AS SELECT s, count(*) AS n FROM t GROUP BY s",
    "UPDATE t SET f = i * 2 WHERE i > 10",
    "DELETE FROM t WHERE i = 2",
    "CREATE TABLE gone(x INTEGER)",
    "DROP TABLE gone",
    "CREATE OR REPLACE TABLE agg AS SELECT s, count(*) AS n, sum(i) AS total FROM t GROUP BY s",
]
QUERIES = ["SELECT * FROM t ORDER BY i", "SELECT s, n FROM agg ORDER BY s NULLS FIRST"]


def _rows(rel):
    return [tuple(r) for r in rel.fetchall()]


def _values(t: pa.Table) -> list[tuple]:
    return [tuple(r.values()) for r in t.to_pylist()]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The SETUP statements run on an opforge database folder and a DuckDB file."""
    root = tmp_path_factory.mktemp("db")
    con = sql.connect("cpu", database=str(root / "op"))
    duck = duckdb.connect(str(root / "duck.db"))
    for s in SETUP:
        con.sql(s).fetchall()
        duck.execute(s)
    con.close()
    duck.close()
    return root


def test_tables_persist_across_connections_like_duckdb(built):
    con = opforge.connect(str(built / "op"), device="cpu")  # DuckDB's connect("path") habit
    duck = duckdb.connect(str(built / "duck.db"), read_only=True)
    assert con.tables() == ["agg", "t"]
    for q in QUERIES:
        assert _rows(con.sql(q)) == duck.sql(q).fetchall(), q
    # the DEFAULT and the PRIMARY KEY persisted with the table
    assert _rows(con.sql("SELECT s FROM t WHERE i = 3")) == [("dflt",)]
    with pytest.raises(SqlError, match="unique"):
        con.sql("INSERT INTO t (i) VALUES (1)")
    duck.close()


def test_failed_statement_and_orphans_leave_the_committed_state(tmp_path):
    path = str(tmp_path / "db")
    con = sql.connect("cpu", database=path)
    con.sql("CREATE TABLE k(id INTEGER NOT NULL, v VARCHAR)")
    con.sql("INSERT INTO k VALUES (1, 'x'), (2, 'y')")
    with pytest.raises(SqlError):
        con.sql("INSERT INTO k VALUES (3, 'z'), (NULL, 'bad')")
    # a crashed writer's leftovers: a data file no commit names, a half-written catalog
    (tmp_path / "db" / DATA / "stray.parquet").write_bytes(b"PAR1 half")
    (tmp_path / "db" / "catalog.json.tmp-123").write_text("{")
    again = sql.connect("cpu", database=path)
    assert _rows(again.sql("SELECT * FROM k ORDER BY id")) == [(1, "x"), (2, "y")]
    assert sorted(os.listdir(tmp_path / "db" / DATA)) == sorted(again.database.tables["k"].files)
    assert "catalog.json.tmp-123" not in os.listdir(tmp_path / "db")
    # a commit by one connection is seen by the other at its next statement
    again.sql("INSERT INTO k VALUES (5, 'w')")
    con.sql("DELETE FROM k WHERE id = 1")
    assert _rows(again.sql("SELECT id FROM k ORDER BY id")) == [(2,), (5,)]
    assert sql.connect(":memory:").database is None


def test_copy_and_file_reads_match_duckdb(built, tmp_path):
    con = sql.connect("cpu", database=str(built / "op"))
    duck = duckdb.connect(str(built / "duck.db"), read_only=True)
    for ext, option in (("parquet", "(FORMAT parquet)"), ("csv", "(HEADER, DELIMITER ';')")):
        mine, theirs = tmp_path / f"mine.{ext}", tmp_path / f"theirs.{ext}"
        assert _rows(con.sql(f"COPY t TO '{mine}' {option}")) == duck.execute(f"COPY t TO '{theirs}' {option}").fetchall()
        read = "read_parquet('{}')" if ext == "parquet" else "read_csv('{}', delim = ';', header = true)"
        for f in (mine, theirs):  # each engine reads both engines' files
            q = f"SELECT i, s, d, day FROM {read.format(f)} ORDER BY i"
            assert _rows(con.sql(q)) == duck.sql(q).fetchall(), q
    q = f"SELECT count(*), min(day) FROM '{tmp_path / 'theirs.parquet'}'"
    assert _rows(con.sql(q)) == duck.sql(q).fetchall()
    # COPY (query) TO, then COPY ... FROM into a typed table, on both engines
    duck2 = duckdb.connect()
    out = tmp_path / "q.csv"
    con.sql(f"COPY (SELECT i, s FROM t WHERE i > 2) TO '{out}'")
    for c in (con, duck2):
        c.execute("CREATE TABLE IF NOT EXISTS back(i BIGINT, s VARCHAR)")
    assert _rows(con.sql(f"COPY back FROM '{out}'")) == duck2.execute(f"COPY back FROM '{out}'").fetchall()
    assert _rows(con.sql("SELECT * FROM back ORDER BY i")) == duck2.sql("SELECT * FROM back ORDER BY i").fetchall()
    con.sql("DROP TABLE back")
    assert "back" not in sql.connect("cpu", database=str(built / "op")).tables()
    duck.close()


def test_parameters_bind_as_typed_values_like_duckdb():
    con, duck = sql.connect("cpu"), duckdb.connect()
    for c in (con, duck):
        c.execute("CREATE TABLE p(i INTEGER, s VARCHAR, d DECIMAL(8,3), f DOUBLE, day DATE, ok BOOLEAN)")
    rows = [(1, "it's", decimal.Decimal("1.5"), 0.25, datetime.date(2024, 2, 29), True),
            (2, "x'); DROP TABLE p; --", None, -1e300, None, False)]
    for r in rows:
        con.execute("INSERT INTO p VALUES (?, ?, ?, ?, ?, ?)", r)
        duck.execute("INSERT INTO p VALUES (?, ?, ?, ?, ?, ?)", r)
    for q, params in [("SELECT * FROM p WHERE s = ? ORDER BY i", ["x'); DROP TABLE p; --"]),
                      ("SELECT i, $2 AS tag FROM p WHERE i >= $1 OR day = $3 ORDER BY i", [2, "t", datetime.date(2024, 2, 29)]),
                      ("SELECT count(*) FROM p WHERE ok = ? AND f < ?", [True, 1.0]),
                      ("SELECT i FROM p WHERE s = '?' OR i = ?", [1])]:
        assert _rows(con.sql(q, params)) == duck.execute(q, params).fetchall(), q
    with pytest.raises(SqlError, match="2 placeholder"):
        con.sql("SELECT ? + ?", [1])
    with pytest.raises(SqlError, match="1 placeholder"):
        con.sql("SELECT $1", [1, 2])
    with pytest.raises(TypeError, match="parameter 1"):
        con.sql("SELECT ?", [object()])


def test_timestamps_register_persist_and_come_back_as_their_types(tmp_path):
    """TIMESTAMP (ns, from pandas) and TIMESTAMPTZ (a zone) columns: filters, order, groups and
    min / max as DuckDB answers them; stored and read back with their unit and zone."""
    import pandas as pd

    df = pd.DataFrame({
        "k": [1, 2, 1, 3, 2],
        "ts": pd.to_datetime(["2024-01-01 10:00:00.123456789", "2023-12-31 23:59:59", None, "2024-06-01",
                              "2024-01-01 10:00:00"], format="ISO8601"),
        "tz": pd.to_datetime(["2024-01-01 10:00:00", "2023-12-31 23:59:59", "2024-03-01", None, "2024-01-01"],
                             format="ISO8601").tz_localize("Europe/Paris")})
    con = sql.connect("cpu", database=str(tmp_path / "db"))
    duck = duckdb.connect()
    duck.execute("SET TimeZone = 'UTC'")
    con.register("e", df)
    duck.register("e", df)
    con.sql("CREATE TABLE p AS SELECT * FROM e")
    for c in (con, duck):
        c.execute("CREATE TABLE q(id INTEGER, t0 TIMESTAMP, t1 TIMESTAMPTZ)")
        c.execute("INSERT INTO q VALUES (1, TIMESTAMP '2024-05-05 01:02:03.5', '2024-05-05 01:02:03+02'), (2, ?, ?)",
                  [datetime.datetime(2020, 1, 1, 12), datetime.datetime(2020, 1, 1, 12, tzinfo=datetime.timezone.utc)])
    again = sql.connect("cpu", database=str(tmp_path / "db"))
    for q in ["SELECT * FROM {} ORDER BY ts NULLS FIRST, k",
              "SELECT k, min(ts), max(tz), count(*) FROM {} GROUP BY k ORDER BY k",
              "SELECT k FROM {} WHERE ts >= TIMESTAMP '2024-01-01 10:00:00' AND tz < '2024-01-01 09:00:00' ORDER BY k",
              "SELECT ts, count(*) FROM {} GROUP BY ts ORDER BY ts"]:
        ref = duck.sql(q.format("e")).arrow()  # Arrow on both sides: nanoseconds kept
        ref = ref.read_all() if hasattr(ref, "read_all") else ref
        assert _values(again.sql(q.format("p")).to_arrow()) == _values(ref), q
    assert _rows(again.sql("SELECT * FROM q ORDER BY id")) == duck.sql("SELECT * FROM q ORDER BY id").fetchall()
    out = again.sql("SELECT * FROM p").to_pandas()
    assert out.dtypes.to_dict() == df.dtypes.to_dict()
    assert again.sql("SELECT t0, t1 FROM q").to_arrow().schema.types == [pa.timestamp("us"), pa.timestamp("us", "UTC")]
