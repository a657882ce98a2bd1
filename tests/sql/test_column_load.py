"""First touch of a column (``sql/column_load.py``, ``sql/parquet_read.py``, ``runtime/host_staging.py``):
the chunk-wise path gives the same column as the general conversion (``Column.from_arrow``), from
Arrow chunks and from Parquet row groups; registering the TPC-H tables reads no column data."""
import decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import opforge.sql as sql
from opforge.runtime import host_staging
from opforge.sql import column_load, parquet_read, string_sort
from opforge.sql.column import Column
from opforge.sql.table import Table

N = 2500


def _mask(rng, n, nulls):
    return rng.random(n) < 0.2 if nulls else None


def _arrays(rng, nulls: bool) -> dict[str, pa.Array]:
    words = np.array(["pear", "fig", "apple", "", "Zebra", "kiwi", "äpfel", "fig2"], dtype=object)
    cents = rng.integers(-10**17, 10**17, N)
    m = lambda: _mask(rng, N, nulls)  # noqa: E731
    return {
        "i8": pa.array(rng.integers(-128, 127, N).astype(np.int8), mask=m()),
        "i16": pa.array(rng.integers(-2**15, 2**15 - 1, N).astype(np.int16), mask=m()),
        "i32": pa.array(rng.integers(-2**31, 2**31 - 1, N).astype(np.int32), mask=m()),
        "i64": pa.array(rng.integers(-2**62, 2**62, N), mask=m()),
        "u8": pa.array(rng.integers(0, 255, N).astype(np.uint8), mask=m()),
        "f16": pa.array(rng.standard_normal(N).astype(np.float16), mask=m()),
        "f32": pa.array(np.where(rng.random(N) < 0.05, np.nan, rng.standard_normal(N)).astype(np.float32), mask=m()),
        "f64": pa.array(np.where(rng.random(N) < 0.05, -0.0, rng.standard_normal(N)), mask=m()),
        "date": pa.array(rng.integers(-1000, 20000, N).astype(np.int32), mask=m()).cast(pa.date32()),
        "dec": pa.array([decimal.Decimal(int(c)).scaleb(-2) for c in cents], pa.decimal128(18, 2), mask=m()),
        "dec_small": pa.array([decimal.Decimal(int(c) % 10**6).scaleb(-4) for c in cents], pa.decimal128(9, 4),
                              mask=m()),
        "bool": pa.array(rng.random(N) < 0.5, mask=m()),
        "s": pa.array(words[rng.integers(0, len(words), N)], pa.string(), mask=m()),
        "s_large": pa.array(words[rng.integers(0, len(words), N)], pa.large_string(), mask=m()),
        "s_view": pa.array(words[rng.integers(0, 3, N)], pa.string(), mask=m()).cast(pa.string_view()),
        "s_dict": pa.array(words[rng.integers(0, 4, N)], pa.string(), mask=m()).dictionary_encode(),
    }


def _chunked(arr: pa.Array, cuts=(0, 1, 700, 701, 1900, N)) -> pa.ChunkedArray:
    """Uneven chunks, one empty, and slices with offsets (bit-packed masks not byte-aligned)."""
    return pa.chunked_array([arr.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])], arr.type)


def assert_same(got: Column, want: Column):
    assert got.type == want.type and got.dictionary == want.dictionary
    assert got.values.dtype == want.values.dtype and got.values.device == want.values.device
    assert (got.valid is None) == (want.valid is None)
    if want.valid is not None:
        assert torch.equal(got.valid, want.valid)
    g, w = got.values, want.values  # values under NULLs too
    if g.dtype.is_floating_point:  # NaN == NaN and -0.0 != 0.0: compare the bits
        g, w = g.view(torch.int32 if g.dtype == torch.float32 else torch.int64), \
            w.view(torch.int32 if w.dtype == torch.float32 else torch.int64)
    assert torch.equal(g, w)


@pytest.mark.parametrize("nulls", [False, True])
def test_arrow_chunks_load_as_the_general_conversion(nulls):
    rng = np.random.default_rng(5 if nulls else 4)
    for name, arr in _arrays(rng, nulls).items():
        chunked = _chunked(arr)
        got = column_load.load_column(iter(chunked.chunks), N, chunked.type, "cpu", name)
        assert_same(got, Column.from_arrow(chunked, "cpu", name))


def test_all_null_and_empty_columns():
    for arr in (pa.nulls(10, pa.int64()), pa.nulls(10, pa.string()), pa.array([], pa.int32()), pa.array([], pa.string()),
                pa.nulls(5, pa.decimal128(12, 3))):
        chunked = _chunked(arr, (0, len(arr) // 2, len(arr)))
        got = column_load.load_column(iter(chunked.chunks), len(arr), arr.type, "cpu")
        assert_same(got, Column.from_arrow(chunked, "cpu"))


def test_string_dictionary_keeps_only_the_words_that_occur():
    # a dictionary array whose dictionary holds words no row uses (pandas categoricals written to Parquet)
    arr = pa.DictionaryArray.from_arrays(pa.array([2, 0, 2, None, 0], pa.int8()), pa.array(["b", "zz", "a", "c"]))
    got = column_load.load_column(iter([arr]), 5, pa.string(), "cpu")
    assert got.dictionary == ("a", "b")
    assert got.values[got.valid].tolist() == [0, 1, 0, 1]
    assert_same(got, Column.from_arrow(arr, "cpu"))


@pytest.mark.parametrize("nulls", [False, True])
def test_parquet_row_groups_load_as_the_general_conversion(nulls, tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_read, "BATCH_ROWS", 256)  # several decoded batches per row group
    arrays = _arrays(np.random.default_rng(8), nulls)
    table = pa.table(arrays)
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=600)  # 5 row groups, decoded on several threads
    t = Table.from_parquet(str(path), "cpu")
    assert t.num_partitions == 5
    back = pq.read_table(path)
    for name in arrays:
        assert_same(t.column(name), Column.from_arrow(back.column(name), "cpu", name).mark_sorted())


@pytest.mark.parametrize("dictionary_page", [1 << 20, 300])  # 300 bytes: the writer falls back to plain pages
@pytest.mark.parametrize("radix_sort", [False, True])  # string_sort, as on a GPU
def test_parquet_strings_load_as_the_general_conversion(dictionary_page, radix_sort, tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_read, "BATCH_ROWS", 256)
    monkeypatch.setattr(column_load, "sorts_strings_on", lambda device: radix_sort)
    rng = np.random.default_rng(11)
    alphabet = np.array(list("ab\x00éz😀 "), dtype=object)
    distinct = ["".join(alphabet[rng.integers(0, len(alphabet), rng.integers(0, 12))]) for _ in range(N)]
    few = np.array(["pear", "fig", "", "äpfel", "fig\x00"], dtype=object)[rng.integers(0, 5, N)]
    table = pa.table({"distinct": pa.array(distinct, mask=rng.random(N) < 0.1),
                      "distinct_nonnull": pa.array(distinct),
                      "few": pa.array(few, mask=rng.random(N) < 0.1),
                      "mostly_null": pa.array(distinct, mask=np.arange(N) != 1700),
                      "all_null": pa.nulls(N, pa.string())})
    path = tmp_path / "s.parquet"
    pq.write_table(table, path, row_group_size=600, dictionary_pagesize_limit=dictionary_page)
    meta = pq.ParquetFile(path).metadata
    mostly_distinct = {n: parquet_read.RowGroups([(str(path), meta)], n, True).mostly_distinct() for n in table.column_names}
    assert mostly_distinct["distinct"] and mostly_distinct["distinct_nonnull"] and not mostly_distinct["few"]
    t = Table.from_parquet(str(path), "cpu")
    back = pq.read_table(path)
    for name in table.column_names:
        assert_same(t.column(name), Column.from_arrow(back.column(name), "cpu", name).mark_sorted())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned part buffers and string_sort on a GPU need CUDA")
def test_parquet_columns_on_cuda_load_as_the_general_conversion(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_read, "BATCH_ROWS", 256)
    rng = np.random.default_rng(12)
    arrays = _arrays(rng, True)
    arrays["distinct"] = pa.array(["".join(rng.choice(list("ab\x00éz😀 "), rng.integers(0, 12))) for _ in range(N)],
                                  mask=rng.random(N) < 0.1)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table(arrays), path, row_group_size=600, dictionary_pagesize_limit=300)
    t = Table.from_parquet(str(path), "cuda")
    back = pq.read_table(path)
    for name in arrays:
        assert_same(t.column(name), Column.from_arrow(back.column(name), "cuda", name).mark_sorted())


def test_row_groups_too_large_for_a_staging_part_load_alike(tmp_path, monkeypatch):
    monkeypatch.setattr(host_staging, "PART_BYTES_MAX", 1024)  # 600-row groups of 8-byte values: too large
    arrays = _arrays(np.random.default_rng(9), True)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table(arrays), path, row_group_size=600)
    t = Table.from_parquet(str(path), "cpu")
    back = pq.read_table(path)
    for name in arrays:
        assert_same(t.column(name), Column.from_arrow(back.column(name), "cpu", name).mark_sorted())


def test_row_groups_come_back_in_file_order(tmp_path):
    path = tmp_path / "order.parquet"
    pq.write_table(pa.table({"x": np.arange(10_000)}), path, row_group_size=333)
    meta = pq.ParquetFile(path).metadata
    chunks = list(parquet_read.RowGroups([(str(path), meta)], "x", False))
    assert np.array_equal(np.concatenate([c.to_numpy() for c in chunks]), np.arange(10_000))
    assert Table.from_parquet(str(path), "cpu").column("x").sorted


def test_staging_checks_the_row_count_and_needs_no_cuda():
    pieces = [np.arange(5, dtype=np.int64), np.arange(10, dtype=np.int64).reshape(5, 2)[:, 0]]
    out = host_staging.to_device(iter(pieces), 10, torch.int64, "cpu")
    assert out.tolist() == [0, 1, 2, 3, 4, 0, 2, 4, 6, 8]
    with pytest.raises(ValueError, match="expected 11"):
        host_staging.to_device(iter(pieces), 11, torch.int64, "cpu")


def _parts(values: np.ndarray, cuts) -> list:
    def filler(lo, hi):
        def fill(dst):
            dst[:] = values[lo:hi]
        return fill
    return [(hi - lo, filler(lo, hi)) for lo, hi in zip(cuts[:-1], cuts[1:])]


def test_filled_parts_check_the_row_count():
    values = np.arange(1000, dtype=np.int64)
    out = host_staging.fill_to_device(_parts(values, (0, 10, 10, 999, 1000)), 1000, torch.int64, "cpu", 3)
    assert torch.equal(out, torch.from_numpy(values))
    with pytest.raises(ValueError, match="expected 1001"):
        host_staging.fill_to_device(_parts(values, (0, 500, 1000)), 1001, torch.int64, "cpu", 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned staging needs CUDA")
def test_pinned_part_buffers_on_cuda_are_reused_in_order():
    values = np.arange(3_000_000, dtype=np.int64)
    cuts = list(range(0, len(values), 100_000)) + [len(values)]  # 30 parts, more than the buffers in flight
    for threads in (1, 4):
        out = host_staging.fill_to_device(_parts(values, cuts), len(values), torch.int64, "cuda", threads)
        assert torch.equal(out.cpu(), torch.from_numpy(values))
    with pytest.raises(ValueError, match="hold 12 values, expected 10"):
        host_staging.fill_to_device(_parts(values, (0, 6, 12)), 10, torch.int64, "cuda", 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned staging needs CUDA")
def test_pinned_staging_on_cuda_spans_several_buffers():
    big = np.arange(3 * host_staging.SLOT_BYTES // 8 + 17, dtype=np.int64)
    out = host_staging.to_device(iter([big[:1000], big[1000:]]), len(big), torch.int64, "cuda")
    assert torch.equal(out.cpu(), torch.from_numpy(big))


def test_registering_the_tpch_tables_reads_no_column_data(tpch_paths, monkeypatch):
    reads = []
    real = pq.ParquetFile.read_row_group

    real_batches = pq.ParquetFile.iter_batches

    def counted(self, *args, **kwargs):
        reads.append(args)
        return real(self, *args, **kwargs)

    def counted_batches(self, *args, **kwargs):  # a row group decoded in batches (parquet_read.RowGroups.parts)
        reads.extend(kwargs["row_groups"])
        return real_batches(self, *args, **kwargs)

    for fn in ("read_table", "read_pandas"):
        monkeypatch.setattr(pq, fn, lambda *a, **k: pytest.fail(f"pq.{fn} while registering"))
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted_batches)
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("ParquetFile.read while registering"))
    con = sql.connect("cpu")
    for name, path in tpch_paths.items():
        con.register(name, str(path))
    assert reads == []
    assert all(con._tables[n].loaded_columns() == [] for n in tpch_paths)
    assert all(con._stats[n].columns.computed() == [] for n in tpch_paths)
    n = con.sql("SELECT count(*) AS n, sum(l_quantity) AS q FROM lineitem WHERE l_returnflag = 'R'").fetchall()
    # two columns, each row group once, and the string column's first batch once more (the probe
    # parquet_read.RowGroups.mostly_distinct)
    assert len(reads) == 2 * con._tables["lineitem"].num_partitions + 1
    assert con._tables["lineitem"].loaded_columns() == ["l_quantity", "l_returnflag"]
    import duckdb

    want = duckdb.sql(f"SELECT count(*), sum(l_quantity) FROM read_parquet('{tpch_paths['lineitem']}') "
                      "WHERE l_returnflag = 'R'").fetchall()
    assert n == want


@pytest.fixture(scope="module")
def tpch_paths():
    from opforge.sql.tpch import data

    return data.generate(0.01)


@pytest.mark.parametrize("batch_bytes", [1 << 27, 5])  # 5 bytes: many batches, words split across none
def test_gathered_words_are_the_rows_strings(batch_bytes, monkeypatch):
    monkeypatch.setattr(string_sort, "GATHER_BYTES", batch_bytes)
    rng = np.random.default_rng(5)
    words = ["".join(rng.choice(list("ab\x00é😀"), rng.integers(0, 6))) for _ in range(300)]
    encoded = [w.encode() for w in words]
    offsets = torch.tensor(np.cumsum([0] + [len(b) for b in encoded]), dtype=torch.int64)
    data = torch.tensor(list(b"".join(encoded)) or [0], dtype=torch.uint8)[:int(offsets[-1])]
    rows = torch.tensor(rng.permutation(300)[:200].tolist() + [3, 3, 0], dtype=torch.int64)
    ends, raw = string_sort.gathered_words(offsets, data, rows)
    got = pa.Array.from_buffers(pa.large_string(), len(rows), [None, pa.py_buffer(ends), pa.py_buffer(raw)])
    assert got.to_pylist() == [words[r] for r in rows.tolist()]
    none = string_sort.gathered_words(offsets, data, rows[:0])
    assert none[0].tolist() == [0] and len(none[1]) == 0


@pytest.mark.parametrize("radix_sort", [False, True])  # merged on the device, as on a GPU
def test_merged_dictionaries_are_the_sorted_union_and_its_code_maps(radix_sort, monkeypatch):
    from opforge.sql import column as C

    monkeypatch.setattr(column_load, "sorts_strings_on", lambda device: radix_sort)
    monkeypatch.setattr(C, "DEVICE_MERGE_WORDS", 2)
    rng = np.random.default_rng(5)
    pool = ["", "a", "ab", "b", "é", "z" * 30, "Customer#1", "Customer#10", "Customer#2"] + \
        [f"w{int(x)}" for x in rng.integers(0, 10 ** 6, 400)]
    dicts = [tuple(sorted(set(rng.choice(pool, size=k).tolist()))) for k in (300, 0, 5, 250)]
    dicts[3] = C.ArrowWords(pa.array(dicts[3]))  # a loaded column's lazy dictionary
    merged, maps = C.merge_dictionaries(*dicts, device="cpu")
    want = sorted(set().union(*map(tuple, dicts)))
    assert tuple(merged) == tuple(want)
    for d, m in zip(dicts, maps):
        assert [merged[i] for i in m.tolist()] == list(d)
    nested = C.merge_dictionaries((1, 3), (2, 3), device="cpu")  # no strings: the host path
    assert nested[0] == (1, 2, 3) and [m.tolist() for m in nested[1]] == [[0, 2], [1, 2]]
