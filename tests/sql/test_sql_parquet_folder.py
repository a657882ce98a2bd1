"""A folder of Parquet files registered as one table (what a partitioned data set or a parallel
writer leaves): read lazily, file after file in name order, in memory and under a device memory
limit (the host cache codes a string column once over all the files); against DuckDB's
``read_parquet('folder/*.parquet')``, and the errors for a folder that is not one table."""
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opforge import sql
from opforge.sql.errors import SqlError
from opforge.sql.outofcore import chunked_scan

QUERIES = [
    "select count(*), sum(k), min(c), max(c) from t",
    "select s, count(*), sum(v) from t group by s order by s",
    "select c, k from t where c like '%ab%' order by c, k limit 9",
    "select count(distinct c) from t where k % 3 = 0",
    "select t.s, count(*) from t join t as u on t.c = u.c and t.k <> u.k group by t.s order by t.s",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("folder")
    parts = []
    for i in range(4):  # names sort as part-0, part-1, ...: the rows' order
        n = 2500 + 500 * i
        words = ["".join(rng.choice(list("abcde"), rng.integers(1, 7))) for _ in range(n)]
        part = pa.table({"k": np.arange(n) + 10_000 * i, "v": rng.integers(-1000, 1000, n), "c": words,
                         "s": [f"s{int(x)}" for x in rng.integers(0, 6, n)]})
        pq.write_table(part, path / f"part-{i}.parquet", row_group_size=1000)
        parts.append(part)
    (path / "_SUCCESS").write_text("")  # a writer's marker: not data
    (path / ".part-9.parquet.crc").write_text("x")
    return path, pa.concat_tables(parts)


def _duck(path):
    d = duckdb.connect()
    d.sql(f"create view t as select * from read_parquet('{path}/*.parquet')")
    return d


@pytest.mark.parametrize("limit", [None, "64KiB"], ids=["in memory", "out of core"])
def test_folder_is_one_table_matching_duckdb(folder, monkeypatch, limit):
    path, whole = folder
    monkeypatch.setattr(chunked_scan, "_DICTIONARIES", {})
    monkeypatch.setattr(chunked_scan, "HOST_CACHE", chunked_scan.HostCache())
    index_in = []
    real = chunked_scan._codes
    monkeypatch.setattr(chunked_scan, "_codes", lambda arr, ordered: index_in.append(1) or real(arr, ordered))
    con = sql.connect("cpu", memory_limit=limit)
    con.register("t", str(path))
    ref = _duck(path)
    for q in QUERIES:
        assert con.sql(q).fetchall() == ref.sql(q).fetchall(), q
    assert not index_in  # strings coded once over the four files, not mapped row group by row group
    assert con.sql("select * from t").to_arrow().equals(whole)  # the files' rows in name order


def test_folder_out_of_core_past_the_host_cache_reads_file_after_file(folder, monkeypatch):
    path, _ = folder
    monkeypatch.setenv(chunked_scan.HOST_CACHE_ENV, "1KiB")  # nothing fits: batches, file after file
    monkeypatch.setattr(chunked_scan, "_DICTIONARIES", {})
    con = sql.connect("cpu", memory_limit="64KiB")
    con.register("t", str(path))
    ref = _duck(path)
    for q in QUERIES[:3]:
        assert con.sql(q).fetchall() == ref.sql(q).fetchall(), q


def test_folders_that_are_not_one_table(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SqlError, match="holds no .parquet file"):
        sql.connect("cpu").register("t", str(empty)).sql("select count(*) from t").fetchall()
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), mixed / "a.parquet")
    pq.write_table(pa.table({"a": ["x"]}), mixed / "b.parquet")
    with pytest.raises(SqlError, match=r"files of folder .* differ: .*b\.parquet' has columns a string"):
        sql.connect("cpu").register("t", str(mixed)).sql("select count(*) from t").fetchall()
    broken = tmp_path / "broken"
    broken.mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), broken / "a.parquet")
    (broken / "b.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(SqlError, match=r"b\.parquet' is not a readable Parquet file"):
        sql.connect("cpu").register("t", str(broken)).sql("select count(*) from t").fetchall()


def test_read_parquet_of_a_glob_or_a_list_is_one_lazy_table(folder, tmp_path):
    path, whole = folder
    con, ref = sql.connect("cpu", memory_limit="64KiB"), _duck(path)
    files = sorted(str(p) for p in path.glob("part-*.parquet"))
    for source in (f"'{path}/part-*.parquet'", "[" + ", ".join(f"'{f}'" for f in files) + "]"):
        for q in QUERIES:
            q = f"with t as (select * from read_parquet({source})) {q}"
            assert con.sql(q).fetchall() == ref.sql(q).fetchall(), q
    hidden = next(iter(con._registered.values()))  # the glob's hidden table: lazy, over the four files
    assert len(hidden.columns.files) == 4
    pq.write_table(pa.table({"a": pa.array([1, 2], pa.int32())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"a": pa.array([3], pa.int64())}), tmp_path / "b.parquet")
    with pytest.raises(SqlError, match=r"files of the list differ: .*b\.parquet' has columns a int64"):
        con.sql(f"select sum(a) from read_parquet('{tmp_path}/*.parquet')").fetchall()
