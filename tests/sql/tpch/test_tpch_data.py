"""TPC-H generation: cardinalities of the spec, DuckDB's column types, keys, the cache."""

import time

import duckdb
import pyarrow.parquet as pq
import pytest

from opforge.sql.tpch import data

# TPC-H spec 4.2.5 cardinalities at SF 0.01 (lineitem varies with the order sizes; dbgen gives 60175).
ROWS_SF001 = {
    "region": 5, "nation": 25, "supplier": 100, "customer": 1500,
    "part": 2000, "partsupp": 8000, "orders": 15000, "lineitem": 60175,
}

# DuckDB's tpch extension column types, as DuckDB's DESCRIBE names them.
DUCKDB_TYPES = {
    "region": "INTEGER VARCHAR VARCHAR",
    "nation": "INTEGER VARCHAR INTEGER VARCHAR",
    "supplier": "BIGINT VARCHAR VARCHAR INTEGER VARCHAR DECIMAL(15,2) VARCHAR",
    "customer": "BIGINT VARCHAR VARCHAR INTEGER VARCHAR DECIMAL(15,2) VARCHAR VARCHAR",
    "part": "BIGINT VARCHAR VARCHAR VARCHAR VARCHAR INTEGER VARCHAR DECIMAL(15,2) VARCHAR",
    "partsupp": "BIGINT BIGINT BIGINT DECIMAL(15,2) VARCHAR",
    "orders": "BIGINT BIGINT VARCHAR DECIMAL(15,2) DATE VARCHAR VARCHAR INTEGER VARCHAR",
    "lineitem": "BIGINT BIGINT BIGINT BIGINT DECIMAL(15,2) DECIMAL(15,2) DECIMAL(15,2) DECIMAL(15,2) "
    "VARCHAR VARCHAR DATE DATE DATE VARCHAR VARCHAR VARCHAR",
}


def test_generate_returns_every_table_with_spec_cardinalities(tpch_paths):
    assert set(tpch_paths) == set(ROWS_SF001)
    for name, path in tpch_paths.items():
        assert path.suffix == ".parquet" and path.is_file()
        assert pq.ParquetFile(path).metadata.num_rows == ROWS_SF001[name], name


def test_column_types_are_duckdb_tpch_types(tpch_paths):
    con = duckdb.connect()
    for name, path in tpch_paths.items():
        described = con.sql(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
        assert " ".join(row[1] for row in described) == DUCKDB_TYPES[name], name
        assert [row[0] for row in described] == data.SCHEMAS[name].names


def test_manifest_records_generator_and_rows(tpch_paths):
    manifest = data.read_manifest(tpch_paths["region"].parent)
    assert manifest["generator"].startswith("tpchgen-cli")
    assert manifest["scale_factor"] == 0.01
    assert {t: e["rows"] for t, e in manifest["tables"].items()} == ROWS_SF001


def test_keys_and_domains_follow_the_spec(tpch_paths):
    tables = data.load(0.01, tpch_paths["region"].parent.parent)
    orders = tables["orders"].to_pandas()
    lineitem = tables["lineitem"].to_pandas()
    assert orders["o_orderkey"].is_unique
    assert not lineitem.duplicated(["l_orderkey", "l_linenumber"]).any()
    assert set(lineitem["l_returnflag"]) == {"A", "N", "R"}
    assert set(lineitem["l_linestatus"]) == {"F", "O"}
    assert lineitem["l_orderkey"].isin(orders["o_orderkey"]).all()
    assert set(tables["region"].column("r_name").to_pylist()) == {"AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST"}
    assert str(lineitem["l_shipdate"].min()) >= "1992-01-02" and str(lineitem["l_shipdate"].max()) <= "1998-12-01"


def test_second_generate_uses_the_cache(tpch_paths, tpch_root):
    mtimes = {t: p.stat().st_mtime_ns for t, p in tpch_paths.items()}
    started = time.perf_counter()
    again = data.generate(0.01, tpch_root)
    assert time.perf_counter() - started < 0.5
    assert {t: p.stat().st_mtime_ns for t, p in again.items()} == mtimes


def test_incomplete_data_set_is_regenerated(tmp_path):
    paths = data.generate(0.01, tmp_path)
    paths["nation"].unlink()
    assert data.read_manifest(paths["nation"].parent) is None
    again = data.generate(0.01, tmp_path)
    assert pq.read_table(again["nation"]).num_rows == 25


def test_load_selected_tables_and_bad_names(tpch_root, tpch_paths):
    tables = data.load(0.01, tpch_root, tables=["nation"])
    assert list(tables) == ["nation"] and tables["nation"].schema.equals(data.SCHEMAS["nation"])
    with pytest.raises(ValueError, match="nations"):
        data.load(0.01, tpch_root, tables=["nations"])


@pytest.mark.parametrize("sf", [0, -1, "1", None, True])
def test_bad_scale_factor_names_the_argument(sf):
    with pytest.raises(ValueError, match="scale factor sf"):
        data.data_dir(sf, "/tmp")


def test_scale_factor_folder_names():
    assert data.sf_label(0.01) == "sf0.01" and data.sf_label(10) == "sf10" and data.sf_label(1.0) == "sf1"


def _killed_at(raw_name: str):
    """``data._conform`` as a run killed when it reaches the generator's file ``raw_name``."""
    conform = data._conform

    def failing(src, dst, schema):
        if src.name == raw_name:
            raise RuntimeError("killed")
        return conform(src, dst, schema)
    return failing


def test_interrupted_generation_resumes_with_the_finished_tables(tmp_path, monkeypatch):
    """A run killed mid-way (here: lineitem's conform fails) leaves its finished tables and complete
    raw files in ``.sf<sf>-partial``; the next run conforms only what is left, without generating."""
    conform = data._conform
    monkeypatch.setattr(data, "_conform", _killed_at("lineitem.parquet"))
    with pytest.raises(RuntimeError, match="killed"):
        data.generate(0.01, tmp_path)
    partial = tmp_path / ".sf0.01-partial"
    finished = {p.name: p.stat().st_mtime_ns for p in partial.glob("*.parquet")}
    assert "nation.parquet" in finished and "lineitem.parquet" not in finished
    monkeypatch.setattr(data, "_conform", conform)
    calls = []
    run = data.subprocess.run
    monkeypatch.setattr(data.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or run(cmd, **kw))
    paths = data.generate(0.01, tmp_path)
    assert [c for c in calls if "parquet" in c] == []  # lineitem's raw file was complete: not made again
    assert {n: paths[n.removesuffix(".parquet")].stat().st_mtime_ns for n in finished} == finished
    assert pq.ParquetFile(paths["lineitem"]).metadata.num_rows == ROWS_SF001["lineitem"]
    assert not partial.exists() and not list(paths["region"].parent.glob("*.done.json"))


def test_large_tables_in_parts_equal_the_single_files(tmp_path, monkeypatch, tpch_paths):
    """From ``SPLIT_SF`` on (lowered here) lineitem, orders and partsupp are generated in parts and
    conformed side by side into a folder each: the folder's files, in name order, hold the single
    file's rows in its order, and the engine and DuckDB read the folder as the table. A run killed
    while conforming a part makes that table again."""
    monkeypatch.setattr(data, "SPLIT_SF", 0.005)
    conform = data._conform
    monkeypatch.setattr(data, "_conform", _killed_at("orders.2.parquet"))
    with pytest.raises(RuntimeError, match="killed"):
        data.generate(0.01, tmp_path, threads=3)
    monkeypatch.setattr(data, "_conform", conform)
    paths = data.generate(0.01, tmp_path, threads=3)
    manifest = data.read_manifest(paths["region"].parent)
    for name in data.TABLES:
        parted = name in data.PARTED
        assert paths[name].is_dir() == parted and manifest["tables"][name]["rows"] == ROWS_SF001[name]
        if parted:
            assert [p.name for p in sorted(paths[name].glob("*.parquet"))] == [f"part-000{i}.parquet" for i in (1, 2, 3)]
        assert pq.read_table(paths[name]).equals(pq.read_table(tpch_paths[name])), name
    from opforge import sql
    from opforge.sql.tpch import compare, queries, reference

    duck, _ = reference.connect(paths, materialize=False)
    for limit in (None, "256KiB"):  # in memory; out of core, the folders read in chunks
        con = sql.connect("cpu", memory_limit=limit)
        for name, path in paths.items():
            con.register(name, str(path))
        for n in (1, 3, 13, 18):
            text = queries.query(n)
            keys = compare.order_keys(text)
            assert not compare.compare(con.sql(text).to_arrow(), reference.run(duck, text), ordered=keys is not None,
                                       order_by=keys), (n, limit)
        if limit is not None:
            for n in (1, 13):  # lineitem's folder; orders' with its comments coded once over the files
                chunks = sum(s.metrics.get("scan_chunks", 0) for s in con.sql(queries.query(n)).analyze().stats)
                assert chunks > 1, (n, chunks)
