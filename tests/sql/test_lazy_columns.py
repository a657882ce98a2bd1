"""Lazy columns: a registered table's columns reach the device when a query first reads them, and
each column's statistics are computed on the planner's first lookup; answers are unchanged."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import opforge.sql as sql
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.errors import NotSupportedError
from opforge.sql.planner.statistics import LazyColumnStats, column_stats
from opforge.sql.shell import schema
from opforge.sql.table import LazyColumns, Table

from sql_reference import SqlCheck, random_table

QUERIES = [
    "SELECT k, count(*) AS n, min(s) AS lo, max(s) AS hi FROM t WHERE s <> 'fig' GROUP BY k",
    "SELECT id, s, d, dt, flag FROM t WHERE i > 0 AND s LIKE '%a%'",
    "SELECT t.k, sum(u.f) AS sf, count(u.s) AS cs FROM t JOIN u ON t.id = u.id WHERE t.dt > DATE '1995-01-01' "
    "GROUP BY t.k",
    "SELECT s, count(*) AS n FROM u GROUP BY s",
    "SELECT * FROM t WHERE b IS NULL",
    "SELECT count(*) AS n FROM t",
]


@pytest.fixture
def tables():
    rng = np.random.default_rng(11)
    return {"t": random_table(rng, 3000), "u": random_table(rng, 1500)}


@pytest.fixture
def parquet_paths(tables, tmp_path):
    paths = {}
    for name, t in tables.items():
        paths[name] = tmp_path / f"{name}.parquet"
        pq.write_table(t, paths[name], row_group_size=500)  # several row groups: a partitioned table
    return paths


def loaded(con, name):
    return set(con._tables[name].loaded_columns())


def computed(con, name):
    return set(con._stats[name].columns.computed())


@pytest.mark.parametrize("source", ["arrow", "parquet"])
def test_register_loads_no_column(source, tables, parquet_paths):
    con = sql.connect("cpu")
    for name in tables:
        con.register(name, tables[name] if source == "arrow" else parquet_paths[name])
    for name, t in tables.items():
        tab = con._tables[name]
        assert isinstance(tab.columns, LazyColumns)
        assert loaded(con, name) == set() and computed(con, name) == set()
        # names, types and row count come from the Arrow schema
        assert tab.names == t.column_names and tab.num_rows == t.num_rows
        assert tab.types == [T.from_arrow(f.type, f.name) for f in t.schema]
        assert tab.column_type("d") == T.decimal(15, 2) and tab.column_type("s") == T.STRING
        assert len(tab.columns) == len(t.column_names)
    if source == "parquet":
        assert con._tables["t"].num_partitions == 6
    # binding / schema listing loads nothing either
    con.sql("SELECT * FROM t")
    assert schema(con, "t").startswith("t(id INT64, k INT32, i INT32, b INT64, f FLOAT64, d DECIMAL(15,2), "
                                       "dt DATE, s STRING, flag BOOL)  -- 3000 rows")
    assert loaded(con, "t") == set() and computed(con, "t") == set()


@pytest.mark.parametrize("source", ["arrow", "parquet"])
def test_query_loads_exactly_the_columns_it_reads(source, tables, parquet_paths):
    con = sql.connect("cpu")
    for name in tables:
        con.register(name, tables[name] if source == "arrow" else parquet_paths[name])
    con.sql("SELECT k, min(s) AS lo FROM t WHERE s <> 'fig' GROUP BY k").to_arrow()
    assert loaded(con, "t") == {"k", "s"}
    assert loaded(con, "u") == set()
    assert computed(con, "t") <= {"k", "s"} and computed(con, "u") == set()
    con.sql("SELECT t.k, sum(u.f) AS sf FROM t JOIN u ON t.id = u.id GROUP BY t.k").to_arrow()
    assert loaded(con, "t") == {"k", "s", "id"}
    assert loaded(con, "u") == {"id", "f"}
    assert computed(con, "u") <= {"id", "f"}


def test_column_stats_computed_on_first_lookup(tables):
    con = sql.connect("cpu").register("t", tables["t"])
    cols = con._stats["t"].columns
    assert isinstance(cols, LazyColumnStats)
    assert con._stats["t"].rows == tables["t"].num_rows
    # membership, iteration and length compute nothing
    assert "s" in cols and "nope" not in cols and list(cols) == tables["t"].column_names
    assert len(cols) == tables["t"].num_columns and cols.get("nope") is None
    assert cols.computed() == [] and loaded(con, "t") == set()
    for name in ("s", "d", "f", "flag", "dt"):
        eager = column_stats(Column.from_arrow(tables["t"].column(name), "cpu", name).mark_sorted())
        assert cols[name] == eager and cols.get(name) == eager
    assert set(cols.computed()) == {"s", "d", "f", "flag", "dt"}
    assert loaded(con, "t") == {"s", "d", "f", "flag", "dt"}


def test_lazy_table_equals_eager_table(tables, parquet_paths):
    t = tables["t"]
    eager = Table(list(t.column_names), [Column.from_arrow(t.column(i), "cpu", n).mark_sorted()
                                         for i, n in enumerate(t.column_names)])
    lazy = Table.load(parquet_paths["t"], "cpu")
    assert lazy.loaded_columns() == []
    for name in t.column_names:
        a, b = eager.column(name), lazy.column(name)
        assert a.type == b.type and a.dictionary == b.dictionary and a.sorted == b.sorted
        assert a.values.equal(b.values)
        assert (a.valid is None) == (b.valid is None) and (a.valid is None or a.valid.equal(b.valid))
        assert eager.partition_range(name) is None
    assert lazy.column("id") is lazy.column("id")  # cached
    assert lazy.to_arrow().equals(t)
    # iterating .columns loads every column, as the list it replaces
    lazy2 = Table.load(t, "cpu")
    assert [c.type for c in lazy2.columns] == eager.types and lazy2.loaded_columns() == t.column_names
    assert lazy2.columns[1:3][0] is lazy2.column("k")
    moved = Table.load(t, "cpu").to("cpu")
    assert moved.loaded_columns() == t.column_names and moved.to_arrow().equals(t)


@pytest.mark.parametrize("source", ["arrow", "parquet"])
def test_results_equal_duckdb(source, tables, parquet_paths):
    check = SqlCheck({})
    for name, t in tables.items():
        check.con.register(name, t if source == "arrow" else parquet_paths[name])
        check.duck.register(name, t)
    for q in QUERIES:
        check(q)


def test_explain_and_pandas_source(tables):
    con = sql.connect("cpu").register("t", tables["t"].to_pandas())
    assert loaded(con, "t") == set()
    con.sql("EXPLAIN SELECT s, count(*) FROM t WHERE k = 1 GROUP BY s").to_arrow()
    assert loaded(con, "t") <= {"s", "k"}
    assert computed(con, "t") <= {"s", "k"}


def test_unsupported_type_still_fails_at_register():
    t = pa.table({"x": pa.array([b"\x00\x01"], pa.binary()), "y": [1]})  # BLOB: no SQL type here
    with pytest.raises(NotSupportedError):
        sql.connect("cpu").register("t", t)


@pytest.mark.parametrize("row_groups", [1, 4])
def test_register_parquet_reads_no_column_data(tmp_path, row_groups):
    """Registering a Parquet file reads its footer only; a query reads the columns it uses, not the
    file's other columns (the README's promise: unused wide columns cost nothing)."""
    n = 40_000
    wide = pa.array(["comment %08d " % i * 8 for i in range(n)])  # ~3.5 MB of strings nobody reads
    t = pa.table({"k": pa.array(np.arange(n) % 7, pa.int32()), "wide": wide})
    path = tmp_path / "w.parquet"
    pq.write_table(t, path, row_group_size=n // row_groups, compression="none")
    wide_bytes = wide.nbytes
    before = pa.total_allocated_bytes()
    con = sql.connect("cpu").register("w", path)
    assert pa.total_allocated_bytes() - before < wide_bytes // 10
    assert con._tables["w"].num_partitions == row_groups
    out = con.sql("SELECT k, count(*) AS n FROM w GROUP BY k ORDER BY k").to_arrow()
    assert out.column("n").to_pylist() == [len(range(i, n, 7)) for i in range(7)]
    assert pa.total_allocated_bytes() - before < wide_bytes // 10
    assert loaded(con, "w") == {"k"}
    assert con.sql("SELECT max(wide) AS m FROM w").to_arrow().column("m")[0].as_py() == max(wide.to_pylist())


def test_damaged_parquet_is_a_clear_error(tmp_path, tables):
    path = tmp_path / "t.parquet"
    pq.write_table(tables["t"], path)
    data = path.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(sql.SqlError, match="not a readable Parquet file"):
        sql.connect("cpu").register("t", tmp_path / "cut.parquet")
    con = sql.connect("cpu").register("t", path)
    # the footer is intact but a column chunk is overwritten after register
    damaged = bytearray(data)
    damaged[4:len(data) // 2] = b"\x07" * (len(data) // 2 - 4)
    path.write_bytes(bytes(damaged))
    with pytest.raises(sql.SqlError, match="reading column"):
        con.sql("SELECT sum(i) FROM t").to_arrow()
