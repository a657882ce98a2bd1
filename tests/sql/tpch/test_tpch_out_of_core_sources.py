"""Issue 28, out of core from every source: under a device memory limit no base column reaches
the device whole when it is over the limit, neither for the scans nor for the planner's statistics
(the column loader is spied on), whether the tables are Parquet files, Arrow tables, pandas frames
or a persistent database's; the answers equal DuckDB's."""

import pyarrow.parquet as pq
import pytest

from opforge import sql
from opforge.sql import table as table_module
from opforge.sql.outofcore import chunked_scan
from opforge.sql.planner import statistics
from opforge.sql.tpch import compare, queries

LIMIT = 256 << 10
QUERIES = (3,)  # chunked lineitem and orders scans joined with customer, a grouped aggregation, top-k
TABLES = ("customer", "orders", "lineitem")  # what they read


@pytest.fixture(scope="module")
def arrow_tables(tpch_paths):
    return {name: pq.read_table(tpch_paths[name]) for name in TABLES}


def _register(kind, tpch_paths, arrow_tables, tmp_path_factory):
    if kind == "parquet":
        con = sql.connect("cpu", memory_limit=LIMIT)
        for name in TABLES:
            con.register(name, str(tpch_paths[name]))
    elif kind == "arrow":
        con = sql.connect("cpu", memory_limit=LIMIT)
        for name, t in arrow_tables.items():
            con.register(name, t)
    elif kind == "pandas":
        con = sql.connect("cpu", memory_limit=LIMIT)
        for name, t in arrow_tables.items():
            con.register(name, t.to_pandas())
    else:  # a persistent database, written without a limit, opened again with one
        folder = tmp_path_factory.mktemp("db") / "tpch"
        writer = sql.connect("cpu", database=str(folder))
        for name in TABLES:
            writer.sql(f"CREATE TABLE {name} AS SELECT * FROM read_parquet('{tpch_paths[name]}')")
        con = sql.connect("cpu", database=str(folder), memory_limit=LIMIT)
    return con


def _bytes(col) -> int:
    return col.values.numel() * col.values.element_size()


@pytest.fixture
def loads(monkeypatch):
    """(rows, column, bytes) of every whole column and every chunk of one that reaches the device."""
    seen = []
    whole, pieces = table_module.LazyColumns.__getitem__, chunked_scan.column_chunks

    def spy(self, i):
        col = whole(self, i)
        if isinstance(i, int):
            seen.append((self.num_rows, self.names[i], _bytes(col)))
        return col

    def chunk_spy(*args, **kwargs):
        for n, cols in pieces(*args, **kwargs):
            seen.extend((n, name, _bytes(c)) for name, c in cols.items())
            yield n, cols
    monkeypatch.setattr(table_module.LazyColumns, "__getitem__", spy)
    monkeypatch.setattr(chunked_scan, "column_chunks", chunk_spy)
    return seen


@pytest.mark.parametrize("kind", ["parquet", "arrow", "pandas", "database"])
def test_no_base_column_over_the_limit_reaches_the_device(kind, tpch_paths, arrow_tables, tpch_answers, loads,
                                                         tmp_path_factory):
    con = _register(kind, tpch_paths, arrow_tables, tmp_path_factory)
    loads.clear()  # the database's writer ran without a limit
    for n in QUERIES:
        text = queries.query(n)
        ours = con.sql(text).to_arrow()
        keys = compare.order_keys(text)
        diffs = compare.compare(ours, tpch_answers[n], ordered=keys is not None, order_by=keys)
        assert not diffs, f"{kind} {queries.name(n)} out of core differs from DuckDB:\n" + "\n".join(diffs)
    over = [x for x in loads if x[2] > LIMIT]
    assert not over, f"{kind}: columns over the {LIMIT} B limit reached the device: {over}"
    assert any(rows < 60175 and name.startswith("l_") for rows, name, _ in loads)  # lineitem came in chunks
    computed = {name: st.columns.computed() for name, st in con._stats.items()}
    assert computed.get("lineitem"), computed  # the planner did read lineitem's statistics


def test_chunked_statistics_agree_with_resident_ones(arrow_tables):
    """The same column's statistics, from its chunks and whole: counts, range, keys, common values;
    exact as the resident ones are (15000 rows), then by HyperLogLog (``exact_rows`` lowered)."""
    orders = table_module.Table.from_arrow(arrow_tables["orders"], "cpu")

    def chunked(name, rows, exact_rows):
        parts = (cols[name] for _, cols in chunked_scan.column_chunks(orders, [name], "cpu", rows))
        return statistics.chunked_column_stats(parts, orders.num_rows, exact_rows)
    for name, rows in (("o_orderkey", 1024), ("o_orderstatus", 1024), ("o_custkey", 1500), ("o_orderdate", 4096)):
        whole = statistics.column_stats(orders.column(name))
        for exact_rows in (statistics.EXACT_DISTINCT_ROWS, 4096):
            merged = chunked(name, rows, exact_rows)
            assert (merged.rows, merged.nulls, merged.exact) == (whole.rows, whole.nulls, exact_rows > orders.num_rows)
            if name != "o_orderstatus":  # strings: codes of another (file-wide) dictionary, same words
                assert (merged.min, merged.max) == (whole.min, whole.max)
            assert merged.unique == whole.unique, name  # o_orderkey ascends: a key either way
            assert merged.sorted == orders.column(name).sorted, name
            assert merged.distinct == pytest.approx(whole.distinct, rel=0 if merged.exact else 0.05), name
    status = chunked("o_orderstatus", 1024, statistics.EXACT_DISTINCT_ROWS)
    assert status.exact and status.mcv_complete
    got = sorted((status.dictionary[int(v)], round(f, 9)) for v, f in status.mcv)
    counts = arrow_tables["orders"].column("o_orderstatus").value_counts().to_pylist()
    want = sorted((d["values"], round(d["counts"] / orders.num_rows, 9)) for d in counts)
    assert got == want
