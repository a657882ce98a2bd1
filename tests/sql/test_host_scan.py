"""Plans that only read columns of a table are answered from its host data (``sql/host_scan.py``),
with the device path's types and DuckDB's values; CREATE TABLE AS and COPY through it write the
same files DuckDB reads back as the source."""
import datetime
import decimal

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import opforge.sql as sql
from opforge.sql import host_scan
from opforge.sql.executor import Executor


def _source() -> pa.Table:
    return pa.table({
        "i": pa.array([1, None, 3, 4], pa.int64()), "n": pa.array([7, 8, None, 9], pa.int32()),
        "f": pa.array([1.5, None, 2.5, -0.0]), "s": pa.array(["a", None, "c", "a"]),
        "d": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("3.50"), decimal.Decimal("-2.00")],
                      pa.decimal128(15, 2)),
        "dt": pa.array([datetime.date(2020, 1, 1), None, datetime.date(2021, 2, 3), datetime.date(1969, 12, 31)]),
        "ts": pa.array([1, 2, None, 4], pa.timestamp("us")), "b": pa.array([True, None, False, True]),
        "u": pa.array([1, 2, 3, 4], pa.uint32()),  # the engine's type for it is BIGINT: not passed through
    })


@pytest.fixture
def con(tmp_path):
    path = str(tmp_path / "src.parquet")
    pq.write_table(_source(), path, row_group_size=3)
    con = sql.connect("cpu")
    con.register("p", path).register("m", _source())
    return con, path


def _device_path(monkeypatch):
    """Fails the test if a query reaches the device path."""
    def run(self, node, pushed=None):
        raise AssertionError(f"ran on the device: {node.describe()}")

    monkeypatch.setattr(Executor, "run", run)


QUERIES = ["SELECT i, n, f, s, d, dt, ts, b FROM {t}", "SELECT s AS x, i, i AS again FROM {t}",
           'SELECT "dt" FROM {t}']


@pytest.mark.parametrize("table", ["p", "m"])  # a Parquet file, an Arrow table in memory
def test_column_reads_skip_the_device_and_match_duckdb(con, table, monkeypatch):
    c, path = con
    device = {q: c.sql(q.format(t=table)).to_arrow() for q in QUERIES}
    _device_path(monkeypatch)
    for q in QUERIES:
        got = c.sql(q.format(t=table)).to_arrow()
        assert got.schema == device[q].schema and got.equals(device[q])
        want = duckdb.sql(q.format(t=f"'{path}'")).to_arrow_table()
        assert got.column_names == want.column_names and got.to_pylist() == want.to_pylist(), q


def test_anything_computed_or_retyped_takes_the_device_path(con):
    c, _ = con
    for q in ("SELECT i FROM p WHERE i > 1", "SELECT i + 1 FROM p", "SELECT u FROM p", "SELECT * FROM p",
              "SELECT i FROM p LIMIT 2", "SELECT DISTINCT s FROM p"):
        assert host_scan.read(c.sql(q).plan, c._tables) is None, q
    assert c.sql("SELECT u FROM p").to_arrow().column(0).type == pa.int64()  # the engine's BIGINT


def test_ctas_and_copy_of_a_file_write_what_duckdb_reads_back(con, tmp_path, monkeypatch):
    c, path = con
    db = sql.connect("cpu", database=str(tmp_path / "db"))
    db.register("p", path)
    _device_path(monkeypatch)
    db.sql("CREATE TABLE t AS SELECT i, n, f, s, d, dt, ts, b FROM p")
    out = str(tmp_path / "out.parquet")
    db.sql(f"COPY (SELECT s, d, i FROM p) TO '{out}' (FORMAT parquet)")
    monkeypatch.undo()
    want = duckdb.sql(f"SELECT i, n, f, s, d, dt, ts, b FROM '{path}'").fetchall()
    assert db.sql("SELECT * FROM t").fetchall() == want
    assert duckdb.sql(f"SELECT * FROM '{out}'").fetchall() == duckdb.sql(f"SELECT s, d, i FROM '{path}'").fetchall()


def test_a_column_stored_as_a_dictionary_takes_the_device_path(tmp_path):
    path = str(tmp_path / "cat.parquet")
    pq.write_table(pa.table({"s": pa.array(["b", "a", "b"]).dictionary_encode()}), path)  # stored as dictionary
    con = sql.connect("cpu").register("c", path)
    got = con.sql("SELECT s FROM c").to_arrow()
    assert got.column(0).type == pa.string() and got.column(0).to_pylist() == ["b", "a", "b"]
