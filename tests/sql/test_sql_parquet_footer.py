"""Parquet files assembled from row groups encoded side by side (``parquet_write.write`` through
``parquet_footer``): the Thrift codec against the spec's bytes and the footers pyarrow and DuckDB
write; the merged file against the file pyarrow writes in one go (the same bytes), read back by
pyarrow, DuckDB and opforge, statistics included (DuckDB skips row groups by them)."""
import datetime
import decimal

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import opforge.sql as sql
from opforge.sql import parquet_footer as F
from opforge.sql import data_files, parquet_write
from opforge.sql.errors import SqlError

ROWS, GROUP = 237, 50  # five row groups, the last one partial


def _footer(path) -> bytes:
    return F.split(memoryview(open(path, "rb").read()))[1]


def _table(n: int = ROWS) -> pa.Table:
    words = pa.array(["pear", "apple", "fig", "kiwi", "never used"])
    codes = pa.array([None if i % 11 == 0 else (i * 7) % 4 for i in range(n)], pa.int32())
    return pa.table({
        "i": pa.array(range(n), pa.int64()),
        "maybe": pa.array([None if i % 5 == 0 else i * 3 - 200 for i in range(n)], pa.int32()),
        "word": pa.DictionaryArray.from_arrays(codes, words),
        "note": pa.array([f"note {i * 37 % 101}" for i in range(n)]),
        "money": pa.array([decimal.Decimal(i * 13 - 900) / 100 for i in range(n)], pa.decimal128(9, 2)),
        "day": pa.array([datetime.date(2020, 1, 1) + datetime.timedelta(days=i) for i in range(n)]),
        "stamp": pa.array([datetime.datetime(2021, 5, 1, 12) + datetime.timedelta(minutes=i) for i in range(n)],
                       pa.timestamp("us")),
        "flag": pa.array([i % 3 == 0 for i in range(n)]),
        "x": pa.array([i / 7 if i % 9 else None for i in range(n)], pa.float64()),
        "items": pa.array([list(range(i % 4)) if i % 6 else None for i in range(n)], pa.list_(pa.int32())),
        "pair": pa.array([{"a": i, "b": str(i % 3)} for i in range(n)],
                         pa.struct([("a", pa.int64()), ("b", pa.string())])),
    })


def test_codec_writes_the_specs_bytes_and_reads_them_back():
    # field 1 (delta 1) i32 -1: header 0x15, zigzag 1; field 20 (delta 19 > 15): type byte, zigzag id 40
    assert F.encode({1: (F.I32, -1), 20: (F.BINARY, b"ab"), 21: (F.TRUE, False)}) == \
        bytes([0x15, 0x01, 0x08, 0x28, 0x02, 0x61, 0x62, 0x12, 0x00])
    doc = {1: (F.I64, -(1 << 62)), 2: (F.TRUE, True), 3: (F.FALSE, False), 4: (F.DOUBLE, -2.5),
           30: (F.I16, 300), 31: (F.BYTE, -7),
           32: (F.LIST, F.TList(F.I32, list(range(-10, 10)))),  # 20 items: the long list header
           33: (F.LIST, F.TList(F.TRUE, [True, False, True])),
           34: (F.SET, F.TList(F.BINARY, [b"x", b""])),
           35: (F.MAP, F.TMap(F.BINARY, F.STRUCT, [(b"k", {1: (F.I32, 5)}), (b"l", {})])),
           36: (F.MAP, F.TMap(0, 0, [])),
           37: (F.STRUCT, {5: (F.LIST, F.TList(F.STRUCT, [{1: (F.I64, 1)}, {2: (F.I64, 2)}]))})}
    assert F.decode(F.encode(doc)) == doc
    with pytest.raises(SqlError, match="bytes after"):
        F.decode(F.encode(doc) + b"\x00")


def test_footers_of_pyarrow_and_duckdb_round_trip_byte_for_byte(tmp_path):
    data = parquet_write.decoded(_table())
    pq.write_table(data, tmp_path / "a.parquet", row_group_size=GROUP)
    pq.write_table(data, tmp_path / "b.parquet", row_group_size=GROUP, compression="zstd", use_dictionary=False,
                   write_statistics=False)
    duck = duckdb.connect()
    duck.register("data", data)
    duck.execute(f"COPY data TO '{tmp_path / 'c.parquet'}' (FORMAT parquet, ROW_GROUP_SIZE {GROUP})")
    for name in "abc":
        footer = _footer(tmp_path / f"{name}.parquet")
        assert F.encode(F.decode(footer)) == footer, name


@pytest.mark.parametrize("compression", ["snappy", "zstd"])
def test_merged_file_equals_the_file_written_in_one_go(tmp_path, monkeypatch, compression):
    monkeypatch.setattr(parquet_write, "ROW_GROUP_ROWS", GROUP)
    data = _table()
    mine, theirs = tmp_path / "mine.parquet", tmp_path / "theirs.parquet"
    parquet_write.write(data, str(mine), compression)
    plain = parquet_write.decoded(data)
    pq.write_table(plain, theirs, row_group_size=GROUP, compression=compression,
                   use_dictionary=parquet_write.dictionary_columns(plain))
    # the same bytes as pyarrow's own file: pages copied unchanged, offsets moved exactly
    assert mine.read_bytes() == theirs.read_bytes()
    assert pq.read_table(mine).equals(plain)
    a, b = pq.ParquetFile(mine).metadata, pq.ParquetFile(theirs).metadata
    assert (a.num_rows, a.num_row_groups, a.schema) == (b.num_rows, b.num_row_groups, b.schema)
    assert a.num_row_groups == 5
    for g in range(a.num_row_groups):
        assert a.row_group(g).num_rows == b.row_group(g).num_rows
        for c in range(a.num_columns):
            x, y = a.row_group(g).column(c), b.row_group(g).column(c)
            assert (x.statistics, x.compression, x.encodings) == (y.statistics, y.compression, y.encodings)
    for g in range(a.num_row_groups):  # each row group decodes alone at its shifted offsets
        assert pq.ParquetFile(mine).read_row_group(g).equals(pq.ParquetFile(theirs).read_row_group(g))
    duck = duckdb.connect()
    for q in ("SELECT * FROM read_parquet('{}') ORDER BY i",
              "SELECT i, word, money FROM read_parquet('{}') WHERE i BETWEEN 120 AND 130 ORDER BY i",  # pruned
              "SELECT word, count(*), sum(money), min(day), max(stamp) FROM read_parquet('{}') "
              "GROUP BY word ORDER BY 1"):
        assert duck.sql(q.format(mine)).fetchall() == duck.sql(q.format(theirs)).fetchall()
    con = sql.connect("cpu")
    q = "SELECT i, maybe, word, note, money, day, flag FROM read_parquet('{}') WHERE maybe > 0 ORDER BY i"
    assert con.sql(q.format(mine)).fetchall() == duck.sql(q.format(theirs)).fetchall()


def test_empty_and_single_group_tables_are_written_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_write, "ROW_GROUP_ROWS", GROUP)
    for n in (0, GROUP):
        path = tmp_path / f"{n}.parquet"
        parquet_write.write(_table(n), str(path))
        assert pq.read_table(path).equals(parquet_write.decoded(_table(n)))


def test_merge_refuses_parts_whose_offsets_it_cannot_move(tmp_path):
    data = parquet_write.decoded(_table(GROUP))
    pq.write_table(data, tmp_path / "indexed.parquet", write_page_index=True)
    footer = _footer(tmp_path / "indexed.parquet")
    with pytest.raises(SqlError, match="offset index"):
        F.merge([(footer, 0), (footer, 1000)])
    pq.write_table(data.select(["i"]), tmp_path / "other.parquet")
    with pytest.raises(SqlError, match="schemas differ"):
        F.merge([(_footer(tmp_path / "other.parquet"), 0), (footer, 1000)])


def test_files_duckdb_wrote_concatenate_into_one_that_reads_back_whole(tmp_path):
    duck = duckdb.connect()
    parts = []
    for k, n in enumerate((70, 1, 130)):
        path = tmp_path / f"part{k}.parquet"
        duck.execute(f"COPY (SELECT {k} * 1000 + i AS i, 'w' || (i % 7) AS s, CAST(i / 8 AS DECIMAL(12, 3)) AS d, "
                     f"CASE WHEN i % 4 = 0 THEN NULL ELSE DATE '2001-02-03' + CAST(i AS INTEGER) END AS day "
                     f"FROM range({n}) r(i)) TO '{path}' (FORMAT parquet)")
        parts.append(path)
    whole = tmp_path / "whole.parquet"
    with open(whole, "wb") as f:
        F.concatenate((p.read_bytes() for p in parts), f)
    assert pq.ParquetFile(whole).metadata.num_row_groups == 3
    assert pq.read_table(whole).equals(pa.concat_tables([pq.read_table(p) for p in parts]))
    q = "SELECT * FROM read_parquet({}) WHERE i > 1050 ORDER BY i"
    assert duck.sql(q.format(f"'{whole}'")).fetchall() == duck.sql(q.format([str(p) for p in parts])).fetchall()


def test_a_part_that_fails_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_write, "ROW_GROUP_ROWS", GROUP)
    real, calls = pq.write_table, []

    def failing(table, where, **options):
        calls.append(table.num_rows)
        if len(calls) == 3:
            raise OSError("disk full")
        real(table, where, **options)

    monkeypatch.setattr(parquet_write.pq, "write_table", failing)
    target = tmp_path / "out.parquet"
    with pytest.raises(OSError, match="disk full"):
        data_files.write(_table(), str(target), "parquet", {})
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary
