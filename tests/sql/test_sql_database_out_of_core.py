"""A database's tables under a device memory limit are read from their Parquet files chunk by chunk
(``chunked_scan``), never loaded whole on the host (``Database.load``) nor on the device, also when
an INSERT made a table of several files; answers equal DuckDB's, and writes still work."""

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from opforge import sql
from opforge.sql import database, table as table_module
from opforge.sql.outofcore import chunked_scan

LIMIT = 16 << 10


def _rows(t: pa.Table):
    return sorted(tuple((v is not None, v) for v in r) for r in zip(*[c.to_pylist() for c in t.columns]))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    n = 3000
    k = rng.integers(0, 400, n)
    v = pa.array([None if x % 7 == 0 else int(x) for x in rng.integers(0, 1000, n)], pa.int64())
    return pa.table({"k": k, "s": pa.array([f"w{x % 23}" for x in k]), "v": v})


QUERIES = ("SELECT s, count(*) AS c, sum(v) AS t, min(k) AS lo FROM t GROUP BY s",
           "SELECT a.k, a.s, b.v FROM t a JOIN t b ON a.k = b.k AND a.v = b.v WHERE a.s <> 'w3'")


def test_database_table_is_read_in_chunks_from_its_files(data, tmp_path, monkeypatch):
    folder = str(tmp_path / "db")
    writer = sql.connect("cpu", database=folder)
    writer.register("src", data)
    writer.sql("CREATE TABLE t AS SELECT * FROM src WHERE k < 200")
    writer.sql("INSERT INTO t SELECT * FROM src WHERE k >= 200")  # a second data file
    assert len(database.Database(folder).tables["t"].files) == 2

    def refuse(self, name):
        raise AssertionError(f"table {name} loaded whole")
    monkeypatch.setattr(database.Database, "load", refuse)
    seen = []
    whole, pieces = table_module.LazyColumns.__getitem__, chunked_scan.column_chunks

    def spy(self, i):
        col = whole(self, i)
        if isinstance(i, int):
            seen.append((self.names[i], col.values.numel() * col.values.element_size()))
        return col

    def chunk_spy(*args, **kwargs):
        for n, cols in pieces(*args, **kwargs):
            seen.extend((name, c.values.numel() * c.values.element_size()) for name, c in cols.items())
            yield n, cols
    monkeypatch.setattr(table_module.LazyColumns, "__getitem__", spy)
    monkeypatch.setattr(chunked_scan, "column_chunks", chunk_spy)

    con = sql.connect("cpu", database=folder, memory_limit=LIMIT)
    d = duckdb.connect()
    d.register("t", data)
    for q in QUERIES:
        assert _rows(con.sql(q).to_arrow()) == _rows(d.sql(q).to_arrow_table()), q
    assert seen and not [x for x in seen if x[1] > LIMIT], seen
    chunks = sum(s.metrics.get("scan_chunks", 0) for s in con.sql(QUERIES[0]).analyze().stats)
    assert chunks > 2

    monkeypatch.undo()  # a write reads the rows it rewrites
    con.sql("DELETE FROM t WHERE k < 10")
    q = "SELECT count(*), sum(v) FROM t"
    want = d.sql("SELECT count(*), sum(v) FROM t WHERE k >= 10").fetchall()
    assert con.sql(q).fetchall() == want
    assert sql.connect("cpu", database=folder, memory_limit=LIMIT).sql(q).fetchall() == want
