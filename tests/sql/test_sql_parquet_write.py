"""The write path of CREATE TABLE AS SELECT and COPY ... TO (issue 28's throughput work): results
leave the engine with dictionary strings and numpy-built decimals, are decoded in slices on a
thread pool and written as Parquet; every answer is checked against DuckDB or plain Python."""
import bisect
import decimal
import pickle

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import opforge.sql as sql
from opforge.sql import column_load, database, parquet_write
from opforge.sql import types as T
from opforge.sql.column import ArrowWords, Column, arrow_dictionary

ROWS = 300
SOURCE = (f"SELECT i, CASE WHEN i % 7 = 0 THEN NULL ELSE 'w' || (i % 13) END AS s, "
          f"CASE WHEN i % 5 = 0 THEN NULL ELSE CAST((i - 150) * 1.25 AS DECIMAL(9,2)) END AS d, "
          f"DATE '2020-01-01' + CAST(i AS INTEGER) AS day, 'c' || i AS note FROM range({ROWS}) r(i)")


def _rows(rel):
    return [tuple(r) for r in rel.fetchall()]


def test_decoded_gathers_each_slice_like_python(monkeypatch):
    monkeypatch.setattr(parquet_write, "DECODE_ROWS", 7)  # many slices over two chunks
    words = pa.array(["b", "a", "zz", "unused"])
    chunks = [pa.DictionaryArray.from_arrays(pa.array([0, 2, None, 1] * 5, pa.int32()), words),
              pa.DictionaryArray.from_arrays(pa.array([1, None, 0] * 6, pa.int32()), words)]
    table = pa.table({"s": pa.chunked_array(chunks), "n": pa.array(range(38))})
    out = parquet_write.decoded(table)
    expected = [None if c is None else words[c].as_py() for ch in chunks for c in ch.indices.to_pylist()]
    assert out.schema == pa.schema([("s", pa.string()), ("n", pa.int64())])
    assert out.column("s").to_pylist() == expected
    assert out.column("n").equals(table.column("n"))


def test_columns_leave_as_dictionaries_and_decimals_built_from_their_words():
    strings = Column.from_arrow(pa.array(["q", None, "a", "q", "m"]), "cpu")
    plain = strings.to_arrow()
    encoded = strings.to_arrow(dictionary=True)
    assert pa.types.is_dictionary(encoded.type)
    assert encoded.cast(pa.string()).to_pylist() == plain.to_pylist() == ["q", None, "a", "q", "m"]
    # scaled int64 decimals (negative ones sign-extended into the high word), NULLs kept
    values = [decimal.Decimal("-1.05"), None, decimal.Decimal("99999999999.99"), decimal.Decimal("0.00"),
              decimal.Decimal("-99999999999.99")]
    scaled = torch.tensor([-105, 7, 9999999999999, 0, -9999999999999], dtype=torch.int64)
    col = Column(scaled, torch.tensor([True, False, True, True, True]), T.SqlType("DECIMAL", 13, 2))
    out = col.to_arrow()
    assert out.type == pa.decimal128(13, 2)
    assert out.to_pylist() == values


def test_ctas_into_files_then_insert_matches_duckdb(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_write, "ROW_GROUP_ROWS", 64)  # files of several row groups, encoded side by side
    con = sql.connect("cpu", database=str(tmp_path / "op"))
    duck = duckdb.connect()
    for c in (con, duck):
        c.execute(f"CREATE TABLE src AS {SOURCE}")
        c.execute("CREATE TABLE t AS SELECT * FROM src WHERE i % 3 <> 1")  # dictionaries with unused words
    [name] = con.database.tables["t"].files
    stored = pq.ParquetFile(tmp_path / "op" / database.DATA / name)
    assert stored.metadata.num_row_groups == 4  # 200 rows
    assert stored.schema_arrow.field("s").type == pa.string()  # stored as plain strings, the exact types
    q = "SELECT * FROM t ORDER BY i"
    assert _rows(con.sql(q)) == duck.sql(q).fetchall()
    for c in (con, duck):  # the table served from its files takes later writes
        c.execute("INSERT INTO t SELECT i + 1000, s, d, day, note FROM src WHERE i < 4")
        c.execute("UPDATE t SET s = 'x' WHERE i = 1000")
    assert _rows(con.sql(q)) == duck.sql(q).fetchall()
    again = sql.connect("cpu", database=str(tmp_path / "op"))
    assert _rows(again.sql(q)) == duck.sql(q).fetchall()


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_copy_query_to_file_matches_duckdb(tmp_path, fmt):
    con = sql.connect("cpu")
    duck = duckdb.connect()
    for c in (con, duck):
        c.execute(f"CREATE TABLE src AS {SOURCE}")
    mine, theirs = tmp_path / f"mine.{fmt}", tmp_path / f"theirs.{fmt}"
    q = "SELECT s, d, day, note, i FROM src WHERE i % 4 <> 0"
    assert _rows(con.sql(f"COPY ({q}) TO '{mine}'")) == duck.execute(f"COPY ({q}) TO '{theirs}'").fetchall()
    read = "read_parquet" if fmt == "parquet" else "read_csv"
    back = f"SELECT * FROM {read}('{{}}') ORDER BY i"
    assert duck.sql(back.format(mine)).fetchall() == duck.sql(back.format(theirs)).fetchall()
    if fmt == "parquet":
        schema = pq.read_schema(mine)
        assert schema.field("s").type == pa.string() and schema.field("d").type == pa.decimal128(9, 2)
        assert pq.ParquetFile(mine).metadata.row_group(0).column(0).compression == "SNAPPY"


def test_only_columns_with_small_dictionaries_are_dictionary_encoded(tmp_path):
    n = 200_000  # a row group whose dictionaries of distinct values pass the 1 MiB page limit
    rng = np.random.default_rng(7)
    data = pa.table({"few": pa.array(rng.integers(0, 5, n)), "unique": pa.array(rng.permutation(n)),
                     "word": pa.array([f"w{i % 3}" for i in range(n)]),
                     "comment": pa.array([f"comment number {i}" for i in range(n)]),
                     "money": pa.array([decimal.Decimal(i) / 100 for i in range(n)], pa.decimal128(12, 2))})
    assert parquet_write.dictionary_columns(data) == ["few", "word"]
    path = tmp_path / "x.parquet"
    parquet_write.write(data, str(path))
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encoded = {meta.column(i).path_in_schema: "RLE_DICTIONARY" in meta.column(i).encodings for i in range(5)}
    assert encoded == {"few": True, "unique": False, "word": True, "comment": False, "money": False}
    assert pq.read_table(path).equals(data)


def test_arrow_words_answer_as_the_tuple_they_stand_for():
    words = ("", "a", "b\x00", "fig", "é", "😀")
    lazy = ArrowWords(pa.array(words))
    assert len(lazy) == 6 and lazy and not ArrowWords(pa.array([], pa.string()))
    assert arrow_dictionary(lazy) is lazy.arrow and lazy._words is None  # no Python strings yet
    assert (lazy[0], lazy[-1], lazy[1:3]) == (words[0], words[-1], words[1:3])
    assert list(lazy) == list(words) and list(reversed(lazy)) == list(reversed(words))
    assert "fig" in lazy and "figs" not in lazy and lazy.index("é") == 4 and lazy.count("a") == 1
    assert lazy == words and words == lazy and lazy == ArrowWords(pa.array(words)) and lazy != words[:-1]
    assert lazy < words + ("z",) and (lazy <= words, lazy > words[:2], lazy >= words) == (True, True, True)
    assert hash(lazy) == hash(words) and {words: 1}[lazy] == 1
    assert lazy + ("x",) == words + ("x",) and ("x",) + lazy == ("x",) + words and lazy * 2 == words * 2
    assert np.array_equal(np.asarray(lazy, dtype=object), np.asarray(words, dtype=object))
    assert pickle.loads(pickle.dumps(lazy)) == words and type(pickle.loads(pickle.dumps(lazy))) is tuple
    assert [bisect.bisect_left(lazy, w) for w in ("", "b", "zz")] == [bisect.bisect_left(words, w)
                                                                      for w in ("", "b", "zz")]
    assert repr(lazy) == repr(words)
    with pytest.raises(TypeError, match="string array"):
        ArrowWords(pa.array([1, 2]))


def test_a_large_dictionary_goes_to_files_without_python_strings(tmp_path, monkeypatch):
    monkeypatch.setattr(column_load, "LAZY_WORDS", 16)  # a dictionary this large stays Arrow
    source = tmp_path / "src.parquet"
    pq.write_table(pa.table({"i": pa.array(range(ROWS)), "s": pa.array([f"w{i * 7 % 101:03}" if i % 9 else None
                                                                         for i in range(ROWS)])}), source)
    con = sql.connect("cpu", database=str(tmp_path / "op"))
    con.register("src", str(source))
    copied = tmp_path / "copy.parquet"
    # a filter: the rows go through the device (a plain column read would not: sql/host_scan.py)
    con.sql(f"COPY (SELECT * FROM src WHERE i >= 0) TO '{copied}' (FORMAT parquet)").fetchall()
    con.sql("CREATE TABLE t AS SELECT * FROM src WHERE i >= 0").fetchall()
    assert con._registered["src"].columns.loaded() == ["i", "s"]
    words = con._registered["src"].column("s").dictionary
    assert isinstance(words, ArrowWords) and words._words is None  # passed through as Arrow
    duck = duckdb.connect()
    q = "SELECT * FROM read_parquet('{}') ORDER BY i"
    assert duck.sql(q.format(copied)).fetchall() == duck.sql(q.format(source)).fetchall()
    assert _rows(con.sql("SELECT * FROM t ORDER BY i")) == duck.sql(q.format(source)).fetchall()
    # a query that reads the words gets them (the tuple is built then)
    q = "SELECT s, count(*) FROM src WHERE s > 'w050' GROUP BY s ORDER BY s"
    assert _rows(con.sql(q)) == duck.sql(q.replace("src", f"read_parquet('{source}')")).fetchall()
